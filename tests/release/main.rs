//! What is shipped besides the binary: the Helm chart and its rendered manifests, the image and
//! its SBOM, the Grafana dashboard and alerts, the supply-chain policy (deny.toml); one test
//! binary, each file a module. `make test` runs it after `make image`, whose archive `image`
//! unpacks.
//!
//! Apart from `e2e` because the chart's tests install its cluster-wide objects (the CRDs, RBAC,
//! a `default` config of `maxParallelOperations: 1`) on this binary's shared testbed and run the
//! operator with them: those tests, here and in `image`, take turns
//! ([`support::chart::chart_turn`]). `grafana_dashboard` runs a control plane of its own, and
//! `real_node` control planes with a real kubelet node (root; one at a time).

mod grafana_dashboard;
mod helm_chart;
mod image;
mod real_node;
mod supply_chain;

/// The Prometheus of the tests, shared with `e2e` (its alert gates).
use support::prometheus_server;
