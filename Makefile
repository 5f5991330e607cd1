# The two commands of the README, and their parts.
SHELL := /bin/bash
TESTBED := tests/testbed/testbed
BIN_DIR := $(shell $(TESTBED) bin-dir 2>/dev/null)

.PHONY: demo test testbed unit lint image lint-release bench soak

## The demo: a local control plane with simulated nodes, the operator, a rolling maintenance.
demo: testbed
	cargo build --release --bins
	PATH="$(BIN_DIR):$$PATH" scripts/demo

## The whole test suite: unit, property, and end-to-end tests on real control planes.
test: testbed
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	PATH="$(BIN_DIR):$$PATH" cargo test --workspace

## Performance workloads on real control planes, with a dated report (tables, SVG charts) in
## bench/<UTC date>-<size>/: MO_BENCH_SIZE=smoke|small|large (default small); other knobs in the
## header of tests/bench_report.rs.
bench: testbed
	PATH="$(BIN_DIR):$$PATH" MO_BENCH_REPORT_DIR=bench MO_BENCH_SIZE=$${MO_BENCH_SIZE:-small} \
		cargo test --release --test bench_report

## The long reliability runs, not part of `make test`: the operator SIGKILLed 100 times during a
## 200-node rollout and 10 leader failovers (tests/e2e_chaos.rs), then a 30-minute soak on 200
## nodes (tests/soak.rs) whose samples and slopes go to bench/<UTC date>-soak-30m/.
soak: testbed
	PATH="$(BIN_DIR):$$PATH" MO_CHAOS_NODES=200 MO_CHAOS_KILLS=100 MO_CHAOS_FAILOVERS=10 \
		cargo test --release --test e2e_chaos -- --nocapture --test-threads=1
	PATH="$(BIN_DIR):$$PATH" MO_SOAK_REPORT_DIR=bench MO_SOAK_MINUTES=$${MO_SOAK_MINUTES:-30} \
		MO_SOAK_NODES=$${MO_SOAK_NODES:-200} cargo test --release --test soak

## Builds (once per machine) the control plane binaries: etcd, kube-*, kubectl, kwok.
testbed:
	$(TESTBED) build

unit:
	cargo test --workspace --lib --bins

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings

## The operator image as an OCI archive, target/image/maintenance-operator-<version>.oci.tar: a
## static musl binary FROM scratch, built with buildah (no Docker engine needed).
image:
	deploy/build-image.sh

## The release files checked by their own validators: the krew manifest (krew's
## validate-krew-manifest) and the GitHub workflows (actionlint).
lint-release:
	deploy/lint-release.sh
