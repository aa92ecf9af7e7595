#!/bin/sh
# Builds fastpath's Debian package from a built binary, with dpkg-deb:
#
#   scripts/build-deb.sh BINARY OUTDIR    -> OUTDIR/fastpath_VERSION_ARCH.deb
#
# (`make deb` runs it on the release build.) The package holds the binary,
# its man pages and completions (scripts/stage.sh, as `make install`), the
# systemd units (dist/systemd), the annotated example configuration
# (examples/lb.toml), the BIRD configuration the load balancers use
# (dist/bird), README.md and the changelog (CHANGELOG.md), and an empty
# /etc/fastpath for the site's configurations.
# Its tree is staged in a temporary directory outside the source tree.
set -eu
BIN=${1:?usage: scripts/build-deb.sh BINARY OUTDIR}
OUT=${2:?usage: scripts/build-deb.sh BINARY OUTDIR}
src=$(cd "$(dirname "$0")/.." && pwd)
version=$("$BIN" --version | awk '{print $2}')
arch=$(dpkg --print-architecture)
root=$(mktemp -d "${TMPDIR:-/tmp}/fastpath-deb.XXXXXX")
trap 'rm -rf "$root"' EXIT INT TERM
chmod 755 "$root"

PREFIX=/usr DESTDIR=$root ZSH_COMPLETION_DIR=/usr/share/zsh/vendor-completions \
	GZIP_MAN=1 STRIP=1 "$src/scripts/stage.sh" "$BIN" >/dev/null
install -d "$root/lib/systemd/system" "$root/usr/share/doc/fastpath/examples"
install -m 644 "$src"/dist/systemd/*.service "$root/lib/systemd/system/"
install -m 644 "$src/examples/lb.toml" "$src/examples/lb-loaded-host.toml" "$src/dist/bird/bird.conf.example" \
	"$src/dist/bird/fastpath.conf" "$root/usr/share/doc/fastpath/examples/"
# The README the units, man pages and examples point to, as it is (the
# units link to it with file://), and the changelog as Debian keeps it.
install -m 644 "$src/README.md" "$root/usr/share/doc/fastpath/README.md"
gzip -9n < "$src/CHANGELOG.md" > "$root/usr/share/doc/fastpath/changelog.gz"
chmod 644 "$root/usr/share/doc/fastpath/changelog.gz"
# An empty directory, no configuration: a unit runs only the
# configurations the site writes there (fastpath-lb@NAME reads NAME.toml),
# so no example can start announcing its VIPs by mistake; the examples
# are in /usr/share/doc/fastpath/examples.
install -d -m 755 "$root/etc/fastpath"
cat > "$root/usr/share/doc/fastpath/copyright" <<'C'
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: fastpath

Files: *
License: Apache-2.0
 On Debian systems the full text of the Apache License 2.0 is in
 /usr/share/common-licenses/Apache-2.0.
C
chmod 644 "$root/usr/share/doc/fastpath/copyright"

# Depends: the package of each shared library the binary needs (as this
# machine's dpkg knows them), libc6 at least at the newest glibc symbol
# version it uses.
glibc=$(objdump -T "$BIN" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -n 1)
deps=""
for lib in $(readelf -d "$BIN" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p'); do
	path=$(ldconfig -p | awk -v l="$lib" '$1 == l { print $NF; exit }')
	# dpkg knows a library by the path it installed (/lib/... on a merged
	# /usr), so the path as ldconfig names it first.
	pkg=""
	for p in "$path" "$(readlink -f "$path" 2>/dev/null)"; do
		[ -n "$pkg" ] || pkg=$(dpkg -S "$p" 2>/dev/null | head -n 1 | cut -d: -f1 || true)
	done
	if [ -z "$pkg" ]; then
		echo "build-deb.sh: no package provides $lib ($path): add it to Depends by hand" >&2
		exit 1
	fi
	case " $deps " in *" $pkg "*) ;; *) deps="$deps $pkg" ;; esac
done
depends=""
for pkg in $deps; do
	if [ "$pkg" = libc6 ] && [ -n "$glibc" ]; then pkg="libc6 (>= $glibc)"; fi
	depends="${depends:+$depends, }$pkg"
done

install -d "$root/DEBIAN"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat > "$root/DEBIAN/control" <<C
Package: fastpath
Version: $version
Architecture: $arch
Maintainer: fastpath developers <fastpath@localhost>
Installed-Size: $size
Depends: $depends
Recommends: bird2
Section: net
Priority: optional
Description: Maglev load balancer, VALE-style switch, MAIO I/O and disk tools
 fastpath builds fast I/O paths from four systems papers and measures them.
 This package installs the fastpath command, its man pages and shell
 completions, and the systemd units that run a Maglev load balancer
 (fastpath-lb@NAME, /etc/fastpath/NAME.toml) and a backend's GRE
 decapsulation (fastpath-decap@TUN).
 .
 A load balancer announces its VIPs through BIRD (bird2, recommended: a
 backend or a load balancer behind a static route runs without it); the
 BIRD configuration it drives is in /usr/share/doc/fastpath/examples.
C
# Maintainer scripts: tell a running systemd about the units, never on a
# machine that is not running systemd, nor into another root (DPKG_ROOT:
# dpkg --root with --force-script-chrootless).
cat > "$root/DEBIAN/postinst" <<'S'
#!/bin/sh
set -e
# No unit is enabled or started here: which configurations run is the
# site's choice (systemctl enable --now fastpath-lb@NAME).
if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null || true
fi
exit 0
S
cat > "$root/DEBIAN/prerm" <<'S'
#!/bin/sh
set -e
# On removal, stop the load balancers and decapsulation agents while the
# binary is still installed: a load balancer's ExecStopPost withdraws its
# VIPs with it. An upgrade leaves them running on the old binary until
# they are restarted.
if [ "$1" = remove ] && [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
	systemctl stop 'fastpath-lb@*.service' 'fastpath-decap@*.service' >/dev/null || true
fi
exit 0
S
cat > "$root/DEBIAN/postrm" <<'S'
#!/bin/sh
set -e
if { [ "$1" = remove ] || [ "$1" = purge ]; } && [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null || true
fi
exit 0
S
chmod 755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm" "$root/DEBIAN/postrm"
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) > "$root/DEBIAN/md5sums"
chmod 644 "$root/DEBIAN/md5sums" "$root/DEBIAN/control"

mkdir -p "$OUT"
deb="$OUT/fastpath_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
