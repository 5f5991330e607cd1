//! Test support shared by the integration tests: one library, linked into each test binary.
//!
//! Tests run against a real control plane (etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler and KWOK) started by `tests/testbed/testbed`; nothing here fakes the API server.
//! Every wait has a deadline and polls the cluster: tests never sleep for a fixed time.

mod cluster;
mod events;
mod harness;
mod requests;
mod testbed;
mod wait;
mod workloads;

pub mod audit;
pub mod chart;
pub mod faults;
pub mod invariants;
pub mod operator;
pub mod policy;
pub mod prometheus_server;

pub use cluster::*;
pub use events::*;
pub use harness::*;
pub use requests::*;
pub use testbed::*;
pub use wait::*;
pub use workloads::*;

/// Field manager of the server-side applies made here.
pub const FIELD_MANAGER: &str = "maintenance-operator-tests";
/// The identity of the testbed's admin kubeconfig, which the shared operator (and the tests) use:
/// in the audit log, its pod deletions in a test's namespace are the operator's.
pub const ADMIN_USER: &str = "testbed-admin";
