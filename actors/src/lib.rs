//! The I/O shell of the maintenance engine: the supervisor, one actor per request in progress,
//! the shared eviction executor and PDB watches. Every decision they act on comes from
//! `maintenance-core`.

pub mod capacity;
pub mod context;
pub mod drainability;
pub mod events;
pub mod evictor;
pub mod gates;
pub mod http_client;
pub mod metrics;
pub mod notifier;
pub mod openshift;
pub mod pdb_watch;
pub mod request_actor;
pub mod supervisor;
pub mod task;
#[cfg(test)]
mod testing;
pub mod watch_connections;
mod watches;
pub mod writes;
