//! The maintenance engine: the pure core (scheduler, drain planning) and the actors that do the
//! I/O (supervisor, one actor per node under maintenance, the shared eviction executor).

pub mod conditions;
pub mod context;
pub mod drain_plan;
pub mod evictor;
pub mod label_selector;
pub mod metrics;
pub mod node_actor;
pub mod pdb_watch;
pub mod scheduler;
pub mod supervisor;
pub mod task;
