# Thin wrappers; README.md documents them. Every target runs the idempotent
# setup first, so a fresh Debian machine with Rust needs nothing else.
CARGO ?= cargo
OUT ?= out

.PHONY: setup demo test check examples bench lint fuzz soak install deb

setup:
	@scripts/setup.sh

## The main job: a Maglev fleet in a throwaway network of namespaces
## (client, BIRD router with one ECMP route, three load balancers on AF_XDP
## each with its own BIRD, three nginx backends): real HTTP spread over
## load balancers x backends, a load balancer dying and returning, a
## graceful rolling restart under load, a backend removed while a load
## balancer is down, the fleet's tables compared, then everything removed.
## Then two QEMU virtual machines exchanging traffic through the switch
## (ping, a pktgen blast, `fastpath switch status` with the VM ports'
## counters). Then the forwarder on a sample capture, decoded by tshark, the
## Maglev hashing evaluation (section 5.3, plots in out/plots) and the fleet
## simulator at internet scale (plots in out/plots). Needs root.
demo: setup
	$(CARGO) build --release --locked -p fastpath -p quic-peer
	mkdir -p $(OUT)
	./target/release/fastpath lb demo
	./target/release/fastpath switch demo
	./target/release/fastpath lb sample-pcap --out $(OUT)/in.pcap
	./target/release/fastpath lb run --config examples/lb.toml --pcap-in $(OUT)/in.pcap --pcap-out $(OUT)/out.pcap
	@echo "First forwarded packets as tshark decodes them: outer (LB -> backend) and inner (client -> VIP) addresses, GRE protocol type"
	@tshark -r $(OUT)/out.pcap -c 6 -T fields -E header=y -e frame.number -e ip.src -e ip.dst -e ipv6.src -e ipv6.dst -e gre.proto -e _ws.col.Protocol 2>/dev/null
	./target/release/fastpath lb hash-eval --quick --plot-dir $(OUT)/plots
	./target/release/fastpath lb fleet-sim --plot-dir $(OUT)/plots

## Every test of both tiers, after the conventions: formatting, then clippy
## with every warning an error (the workspace lints deny missing docs and
## unsafe blocks without a SAFETY comment). The hermetic tests, then the
## system tests (`#[ignore = "system test: ..."]`: root, namespaces, QEMU,
## BIRD, nginx, systemd, tshark, DPDK), which scripts/setup.sh has made
## runnable: a system test whose prerequisite is missing fails, naming it
## (crates/systest). Tests named `by_hand_` are measurements, not tests.
test: setup lint examples
	$(CARGO) test --workspace --locked --no-fail-fast -- --include-ignored --skip by_hand_

## The hermetic tier alone, for contributors: formatting, clippy, every test
## that needs neither root nor an outside program (the system tests are
## listed as ignored, with what they need), and the library examples. No
## set-up, no root, nothing installed.
check: lint examples
	$(CARGO) test --workspace --locked --no-fail-fast

## The runnable examples of the libraries a program embeds (README, "Library
## examples"): each prints what it did and exits non-zero if its own check
## fails, so `make test` keeps them working as well as compiling.
examples:
	$(CARGO) run --locked -p maglev --example table
	$(CARGO) run --locked -p packet --example rewrite
	$(CARGO) run --locked -p maio --example pool_send
	$(CARGO) run --locked -p ring --example exchange

## The load balancer soaked for ten minutes in the demo's namespaces: wrk
## with and without keep-alive through the VIP while nginx is stopped, a
## decap agent killed, a link cut, backends added and removed by reloads, a
## broken reload sent and a backend drained, once a minute. Prints the
## figures, writes them to out/soak.json and fails if a goal is missed; see
## RELIABILITY.md. Needs root. (`make test` runs a 60-second version.)
## Then the shipped timers on a loaded host: SOAK_SECONDS with busy loops
## twice the cores, the release daemon under the unit's 400 ms watchdog and
## the shipped BFD (100 ms x 3); false withdrawals and watchdog gaps are
## printed and written to out/timers.json (a measurement: README, "Timers").
SOAK_SECONDS ?= 600
soak: setup
	$(CARGO) build --release --locked -p fastpath
	mkdir -p $(OUT)
	./target/release/fastpath lb soak --seconds $(SOAK_SECONDS) --json $(OUT)/soak.json
	FASTPATH_BIN=$(CURDIR)/target/release/fastpath SOAK_SECONDS=$(SOAK_SECONDS) \
		FASTPATH_TIMERS_JSON=$(abspath $(OUT))/timers.json \
		$(CARGO) test --locked -p fastpath --test sys_lb_timers_under_load -- \
		--ignored --nocapture by_hand_false_withdrawals

## Benchmarks, each beside its peer in the same run; see BENCHMARKS.md.
bench: setup
	$(CARGO) bench -p maglev --locked
	$(CARGO) build --release --locked -p fastpath
	./target/release/fastpath lb hash-eval --quick
	./target/release/fastpath lb bench
	./target/release/fastpath switch bench
	./target/release/fastpath maio bench

## Fuzz for FUZZ_SECONDS each (two minutes by default; needs a nightly
## toolchain and cargo-fuzz): the packet parser, then the forwarder over
## sequences of frames, inline and threaded, its corpus first seeded from
## the liveness property test (crates/lb/tests/liveness.rs).
FUZZ_SECONDS ?= 120
fuzz:
	cd crates/packet && $(CARGO) +nightly fuzz run parse_frame -- -max_total_time=$(FUZZ_SECONDS)
	LIVENESS_SEEDS=$(CURDIR)/crates/lb/fuzz/corpus/forward_sequence $(CARGO) test -p lb --test liveness --locked -q
	cd crates/lb && $(CARGO) +nightly fuzz run forward_sequence -- -max_total_time=$(FUZZ_SECONDS) -timeout=60

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

## Installs the fastpath binary, its man pages (fastpath(1) and one per
## subcommand) and its bash, zsh and fish completions under PREFIX
## (/usr/local by default), staged under DESTDIR for packaging, e.g.
## `make install PREFIX=/usr DESTDIR=$(pwd)/pkg`. Builds PROFILE (release)
## only when a source is newer than the binary (so `sudo make install`
## after a build compiles nothing); the pages and completions come from the
## built binary's own CLI definition, written into a temporary directory
## outside the source tree (scripts/stage.sh, which `make deb` shares).
## Needs only cargo (no setup: nothing else is installed).
PREFIX ?= /usr/local
DESTDIR ?=
PROFILE ?= release
BINDIR ?= $(PREFIX)/bin
MANDIR ?= $(PREFIX)/share/man/man1
BASH_COMPLETION_DIR ?= $(PREFIX)/share/bash-completion/completions
ZSH_COMPLETION_DIR ?= $(PREFIX)/share/zsh/site-functions
FISH_COMPLETION_DIR ?= $(PREFIX)/share/fish/vendor_completions.d
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
BUILT := $(TARGET_DIR)/$(if $(filter dev test,$(PROFILE)),debug,$(PROFILE))/fastpath
SOURCES := Cargo.toml Cargo.lock $(shell find crates dist -type f -not -path '*/target/*' 2>/dev/null)
# cargo decides what to rebuild; the touch tells make that the binary is
# current even when cargo found nothing to relink.
$(BUILT): $(SOURCES)
	$(CARGO) build --profile $(PROFILE) --locked -p fastpath
	@touch $@
install: $(BUILT)
	DESTDIR="$(DESTDIR)" PREFIX="$(PREFIX)" BINDIR="$(BINDIR)" MANDIR="$(MANDIR)" \
		BASH_COMPLETION_DIR="$(BASH_COMPLETION_DIR)" ZSH_COMPLETION_DIR="$(ZSH_COMPLETION_DIR)" \
		FISH_COMPLETION_DIR="$(FISH_COMPLETION_DIR)" scripts/stage.sh $(BUILT)

## The Debian package: $(OUT)/fastpath_VERSION_ARCH.deb with the binary,
## man pages, completions, the systemd units (dist/systemd), the annotated
## example configuration and the BIRD configuration the load balancers
## include (dist/bird), built by dpkg-deb from PROFILE's binary
## (scripts/build-deb.sh). `make test` builds and installs one from the
## test build (crates/fastpath/tests/sys_package.rs).
deb: $(BUILT)
	scripts/build-deb.sh $(BUILT) $(OUT)
