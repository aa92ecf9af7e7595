# Thin wrappers; README.md documents them. Every target runs the idempotent
# setup first, so a fresh Debian machine with Rust needs nothing else.
CARGO ?= cargo
OUT ?= out

.PHONY: setup demo test bench lint fmt

setup:
	@scripts/setup.sh

## The main job. Until the load balancer runs on interfaces: the Maglev
## hashing evaluation of the paper's section 5.3, with plots in out/plots.
demo: setup
	$(CARGO) build --release --locked -p fastpath
	./target/release/fastpath lb hash-eval --plot-dir $(OUT)/plots

## Every test.
test: setup
	$(CARGO) test --workspace --locked

## Benchmarks (criterion), each beside its peer; see BENCHMARKS.md.
bench: setup
	$(CARGO) bench -p maglev --locked
	$(CARGO) build --release --locked -p fastpath
	./target/release/fastpath lb hash-eval --quick

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
