#!/bin/sh
# Installs the fastpath binary, its man pages and its bash, zsh and fish
# completions under DESTDIR: the one recipe `make install` and
# scripts/build-deb.sh share.
#
#   scripts/stage.sh BINARY
#
# Where things go (environment, with these defaults):
#   DESTDIR  (empty)  a staging root, e.g. a package's tree
#   PREFIX   /usr/local
#   BINDIR   $PREFIX/bin
#   MANDIR   $PREFIX/share/man/man1
#   BASH_COMPLETION_DIR  $PREFIX/share/bash-completion/completions
#   ZSH_COMPLETION_DIR   $PREFIX/share/zsh/site-functions
#   FISH_COMPLETION_DIR  $PREFIX/share/fish/vendor_completions.d
#   GZIP_MAN=1       compress the man pages (Debian's layout)
#   STRIP=1          install the binary without its debugging symbols
#
# The pages and completions come from the binary's own CLI definition
# (`fastpath man`, `fastpath completions`), written into a temporary
# directory outside the source tree and removed afterwards.
set -eu
BIN=${1:?usage: scripts/stage.sh BINARY}
[ -x "$BIN" ] || { echo "stage.sh: $BIN is not an executable (build it first)" >&2; exit 1; }
PREFIX=${PREFIX:-/usr/local}
DESTDIR=${DESTDIR:-}
BINDIR=${BINDIR:-$PREFIX/bin}
MANDIR=${MANDIR:-$PREFIX/share/man/man1}
BASH_COMPLETION_DIR=${BASH_COMPLETION_DIR:-$PREFIX/share/bash-completion/completions}
ZSH_COMPLETION_DIR=${ZSH_COMPLETION_DIR:-$PREFIX/share/zsh/site-functions}
FISH_COMPLETION_DIR=${FISH_COMPLETION_DIR:-$PREFIX/share/fish/vendor_completions.d}

work=$(mktemp -d "${TMPDIR:-/tmp}/fastpath-stage.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM
"$BIN" man --out "$work/man" >/dev/null
"$BIN" completions bash > "$work/fastpath.bash"
"$BIN" completions zsh > "$work/_fastpath"
"$BIN" completions fish > "$work/fastpath.fish"
if [ "${GZIP_MAN:-0}" = 1 ]; then
	# -n: no name or time in the header, so the same page gives the same bytes.
	gzip -9n "$work"/man/*.1
fi

install -d "$DESTDIR$BINDIR" "$DESTDIR$MANDIR" "$DESTDIR$BASH_COMPLETION_DIR" \
	"$DESTDIR$ZSH_COMPLETION_DIR" "$DESTDIR$FISH_COMPLETION_DIR"
if [ "${STRIP:-0}" = 1 ]; then
	install -m 755 "$BIN" "$work/fastpath"
	strip --strip-unneeded --remove-section=.comment --remove-section=.note "$work/fastpath"
	install -m 755 "$work/fastpath" "$DESTDIR$BINDIR/fastpath"
else
	install -m 755 "$BIN" "$DESTDIR$BINDIR/fastpath"
fi
install -m 644 "$work"/man/* "$DESTDIR$MANDIR/"
install -m 644 "$work/fastpath.bash" "$DESTDIR$BASH_COMPLETION_DIR/fastpath"
install -m 644 "$work/_fastpath" "$DESTDIR$ZSH_COMPLETION_DIR/_fastpath"
install -m 644 "$work/fastpath.fish" "$DESTDIR$FISH_COMPLETION_DIR/fastpath.fish"
echo "installed $DESTDIR$BINDIR/fastpath, $(ls "$work/man" | wc -l) man pages in $DESTDIR$MANDIR, completions for bash, zsh and fish"
