//! The operator on live control planes: one test binary, each file a module.
//!
//! Its tests share one testbed and one operator (`support::operator::shared_cluster`: limits that
//! never hold a test back, a ServiceAccount of its own), each test in its own namespace on its own
//! nodes; or they start a control plane of their own (`Testbed::start`) when they depend on
//! cluster-wide state: the limits (they count every node), the config, leader election, faults,
//! the operator's connections. What uses the shared testbed without an operator (the smoke tests,
//! the API server's validation of configs in a test's namespace) is indifferent to it.
//!
//! Elsewhere, because they cannot share this testbed: `e2e_nvidia` (its shared cluster collects
//! any request Ready for 3 s), `cli` (the plugin tests run operators of their own on their shared
//! testbed), `release` (the chart's cluster-wide objects and operator).
//!
//! The largest scenarios (`chaos`, `faults`, `bench_operator`, the drain at scale) take turns
//! ([`support::large_scenario_turn`]). `make soak` runs `chaos` long:
//! `cargo test --release --test e2e -- chaos:: --test-threads=1`.

mod admission;
mod bad_input;
mod bench_operator;
mod capacity;
mod chaos;
mod drain;
mod edges;
mod faults;
mod fleet;
mod force_delete;
mod gates;
mod leader;
mod lifecycle;
mod node_groups;
mod notifications;
mod nvidia_requestor;
mod openshift_pools;
mod reboot;
mod requestor_watch;
mod scheduling;
mod security;
mod testbed_smoke;
mod webhook;
mod yield_drain;
