#!/bin/bash
# Runs as the first process of new PID + mount (+UTS, IPC) namespaces:
# builds an overlay of / whose writes land in a tmpfs, masks the units that
# touch kernel-wide state, and execs systemd as PID 1 inside it.
set -euo pipefail
STATE=$1; shift
mount --make-rprivate /
mount -t tmpfs -o size=256m tmpfs "$STATE"
mkdir -p "$STATE"/{upper,work,root}
mount -t overlay overlay -o "lowerdir=/,upperdir=$STATE/upper,workdir=$STATE/work" "$STATE/root"
R=$STATE/root
mount -t proc proc "$R/proc"
mount --rbind /sys "$R/sys"; mount -o remount,bind,ro "$R/sys" || true
mount --rbind /dev "$R/dev"
mount -t tmpfs tmpfs "$R/run"; mount -t tmpfs tmpfs "$R/tmp"
mkdir -p "$R/run/netns"
for d in "$@"; do mkdir -p "$R$d"; mount --bind "$d" "$R$d"; done
E=$R/etc/systemd/system
for u in systemd-tmpfiles-setup.service systemd-tmpfiles-setup-dev.service systemd-tmpfiles-clean.timer \
  systemd-tmpfiles-clean.service systemd-sysctl.service systemd-udevd.service systemd-udev-trigger.service \
  systemd-udevd-control.socket systemd-udevd-kernel.socket systemd-udev-settle.service systemd-modules-load.service \
  systemd-binfmt.service proc-sys-fs-binfmt_misc.automount proc-sys-fs-binfmt_misc.mount systemd-remount-fs.service \
  systemd-sysusers.service systemd-journal-flush.service systemd-random-seed.service systemd-update-utmp.service \
  systemd-hwdb-update.service systemd-firstboot.service systemd-machine-id-commit.service ldconfig.service \
  sys-kernel-debug.mount sys-kernel-tracing.mount sys-kernel-config.mount sys-fs-fuse-connections.mount dev-hugepages.mount \
  dev-mqueue.mount systemd-logind.service getty.target console-getty.service cron.service ssh.service \
  systemd-networkd.service systemd-resolved.service systemd-timesyncd.service nginx.service bird.service prometheus.service; do
  ln -sf /dev/null "$E/$u"
done
cat > "$E/fp-boot.target" <<'U'
[Unit]
Description=fastpath test boot
U
cd "$R"; mkdir -p old; pivot_root . old; umount -l /old; rmdir /old 2>/dev/null || true
exec env container=fastpath-test /lib/systemd/systemd --system --unit=fp-boot.target --log-target=console --show-status=no
