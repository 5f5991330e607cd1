//! Every decision of the maintenance operator as a pure function over what was observed: the
//! scheduler, drain planning, label selectors, condition editing, the node lifecycle step and
//! leader election.
//! No I/O, no clocks (time is an argument), no async runtime: the actors gather observations,
//! call these functions and execute what they return.

pub mod access;
pub mod actor_runs;
pub mod blackouts;
pub mod budgets;
pub mod capacity;
pub mod conditions;
pub mod config_health;
pub mod cordon_mark;
pub mod deadline;
pub mod drain_plan;
pub mod drainability;
pub mod eviction;
pub mod explain;
pub mod failed_step;
#[cfg(test)]
mod fixtures;
pub mod gates;
pub mod gc;
pub mod label_selector;
pub mod leader;
pub mod lifecycle;
pub mod machine_config_pool;
pub mod node_view;
pub mod notifications;
pub mod ownership;
pub mod pending_taint;
pub mod plan_input;
pub mod pod_view;
pub mod scheduler;
pub mod tracker;
pub mod validation;
pub mod windows;
pub mod yielding;
