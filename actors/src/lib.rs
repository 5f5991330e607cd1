//! The maintenance engine: the pure core (scheduler, drain planning) and the actors that do the
//! I/O (supervisor, one actor per node under maintenance, the shared eviction executor).

pub mod conditions;
pub mod context;
pub mod evictor;
pub mod metrics;
pub mod node_actor;
pub mod supervisor;
pub mod task;
pub mod scheduler;
pub mod drain_plan;
pub mod label_selector;
