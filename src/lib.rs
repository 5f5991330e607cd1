//! The `maintenance-operator` package: the operator binary's commands, shared with the
//! `kubectl-maintenance` plugin.

pub mod http;
pub mod kubectl;
pub mod leader;
pub mod plan;
pub mod run;
