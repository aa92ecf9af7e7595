# Thin wrappers; README.md documents them. Every target runs the idempotent
# setup first, so a fresh Debian machine with Rust needs nothing else.
CARGO ?= cargo
OUT ?= out

.PHONY: setup demo test bench lint fuzz

setup:
	@scripts/setup.sh

## The main job. Until the load balancer runs on interfaces: the Maglev
## hashing evaluation of the paper's section 5.3 (plots in out/plots), then a
## sample capture forwarded through the load balancer and decoded by tshark.
demo: setup
	$(CARGO) build --release --locked -p fastpath
	./target/release/fastpath lb hash-eval --plot-dir $(OUT)/plots
	./target/release/fastpath lb sample-pcap --out $(OUT)/in.pcap
	./target/release/fastpath lb run --config examples/lb.toml --pcap-in $(OUT)/in.pcap --pcap-out $(OUT)/out.pcap
	@echo "First forwarded packets as tshark decodes them: outer (LB -> backend) and inner (client -> VIP) addresses, GRE protocol type"
	@tshark -r $(OUT)/out.pcap -c 6 -T fields -E header=y -e frame.number -e ip.src -e ip.dst -e ipv6.src -e ipv6.dst -e gre.proto -e _ws.col.Protocol 2>/dev/null

## Every test.
test: setup
	$(CARGO) test --workspace --locked

## Benchmarks, each beside its peer in the same run; see BENCHMARKS.md.
bench: setup
	$(CARGO) bench -p maglev --locked
	$(CARGO) build --release --locked -p fastpath
	./target/release/fastpath lb hash-eval --quick
	./target/release/fastpath lb bench

## Fuzz the packet parser for two minutes (needs a nightly toolchain and cargo-fuzz).
FUZZ_SECONDS ?= 120
fuzz:
	cd crates/packet && $(CARGO) +nightly fuzz run parse_frame -- -max_total_time=$(FUZZ_SECONDS)

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
