# The two commands of the README, and their parts.
SHELL := /bin/bash
TESTBED := tests/testbed/testbed
BIN_DIR := $(shell $(TESTBED) bin-dir 2>/dev/null)
WITH_TESTBED := PATH="$(BIN_DIR):$$PATH"
# The test binaries of `make test` by stage (tests/README.md says what each holds). The release
# checks come last: they read what `make image` and `make lint-release` leave in target/.
E2E_TESTS := e2e e2e_nvidia cli soak bench_report
RELEASE_TESTS := release

.PHONY: demo test test-deps testbed unit lint image lint-release bench soak

## The demo: a local control plane with simulated nodes, the operator, a rolling maintenance.
## DEMO_REAL_NODE=1: the operator's pods from `make image`, installed with helm on a real node.
demo: testbed
	cargo build --release --bins
	$(if $(filter 1,$(DEMO_REAL_NODE)),deploy/build-image.sh >/dev/null)
	$(WITH_TESTBED) scripts/demo

## The whole test suite, its set-up included, the quickest failures first: formatting and lints,
## the unit tests of every crate (core and crds among them, built once with the features the whole
## workspace uses, so the end-to-end build reuses them), the end-to-end tests on real control
## planes, then the image and the release files. SAVE_DISK=1 (CI) removes the Go build cache and
## the musl release tree once they are used.
test: test-deps
	@# A test binary in no stage would go unrun.
	@stray=$$(cd tests && ls *.rs */main.rs | sed 's|/main.rs$$||; s|\.rs$$||' | \
		grep -vxF $(foreach t,$(E2E_TESTS) $(RELEASE_TESTS),-e $(t))); \
		[[ -z $$stray ]] || { echo "make test runs no stage for tests/$$stray"; exit 1; }
	$(MAKE) --no-print-directory lint
	cargo test --workspace --lib --bins
	cargo test --workspace --doc
	$(WITH_TESTBED) cargo test $(E2E_TESTS:%=--test %)
	$(MAKE) --no-print-directory image lint-release
	$(if $(SAVE_DISK),rm -rf target/x86_64-unknown-linux-musl target/release)
	$(WITH_TESTBED) cargo test $(RELEASE_TESTS:%=--test %)

## What `make test` needs besides Go and Rust (Debian packages, rustup components, the control
## plane binaries, helm, the release linters), installed when missing.
test-deps:
	scripts/install-test-deps
	$(if $(SAVE_DISK),go clean -cache)

## Performance workloads on real control planes, with a dated report (tables, SVG charts) in
## bench/<UTC date>-<size>/: MO_BENCH_SIZE=smoke|small|large (default small); other knobs in the
## header of tests/bench_report/main.rs.
bench: testbed
	$(WITH_TESTBED) MO_BENCH_REPORT_DIR=bench MO_BENCH_SIZE=$${MO_BENCH_SIZE:-small} \
		cargo test --release --test bench_report

## The long reliability runs, not part of `make test`: the operator SIGKILLed 100 times during a
## 200-node rollout and 10 leader failovers (tests/e2e/chaos.rs), then a 30-minute soak on 200
## nodes (tests/soak.rs) whose samples and slopes go to bench/<UTC date>-soak-30m/.
soak: testbed
	$(WITH_TESTBED) MO_CHAOS_NODES=200 MO_CHAOS_KILLS=100 MO_CHAOS_FAILOVERS=10 \
		cargo test --release --test e2e -- chaos:: --nocapture --test-threads=1
	$(WITH_TESTBED) MO_SOAK_REPORT_DIR=bench MO_SOAK_MINUTES=$${MO_SOAK_MINUTES:-30} \
		MO_SOAK_NODES=$${MO_SOAK_NODES:-200} cargo test --release --test soak

## Builds (once per machine) the control plane binaries: etcd, kube-*, kubectl, kwok.
testbed:
	$(TESTBED) build

unit:
	cargo test --workspace --lib --bins

## Formatting, clippy, the doc links, and the supply chain: cargo deny checks the dependencies'
## licences, duplicate versions, sources and security advisories against deny.toml.
lint:
	cargo fmt --all -- --check
	scripts/supply-chain
	cargo clippy --workspace --all-targets -- -D warnings
	@# Every intra-doc link resolves (the dependencies' metadata is clippy's, so this is quick).
	RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

## The operator image as an OCI archive, target/image/maintenance-operator-<version>.oci.tar: a
## static musl binary FROM scratch, built with buildah (no Docker engine needed) and cargo
## auditable; beside it the binary's SBOM, maintenance-operator-<version>.cdx.json (CycloneDX).
image:
	deploy/build-image.sh

## The release files checked by their own validators: the krew manifest (krew's
## validate-krew-manifest) and the GitHub workflows (actionlint).
lint-release:
	deploy/lint-release.sh
