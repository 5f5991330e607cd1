//! The writes a scheduling round decides, executed off the supervisor's mailbox: admissions,
//! Pending messages and owners, the pending-drain taint, orphaned cordons undone, garbage
//! collection. Each is started by the round and answered to the supervisor by a message, so a
//! round never waits on the API server; the supervisor's tracker (`maintenance_core::tracker`)
//! remembers what is in flight meanwhile.

pub mod admission;
pub mod gc;
pub mod nodes;
pub mod pending;

use std::sync::Arc;

use futures::StreamExt;
use kube::ResourceExt;
use ractor::ActorRef;

use crate::context::{Context, is_conflict, is_not_found};
use crate::supervisor::SupervisorMsg;

/// Writes (initial Pending status, owner references, reasons, taints) made concurrently in one
/// round.
const PARALLEL_WRITES: usize = 16;

/// Runs `write` for each item, [`PARALLEL_WRITES`] at a time, in a task the round does not wait
/// for. Each item is keyed (a request's UID, a node's name) and its write returns the
/// resourceVersion it wrote, if any; `answer` tells the supervisor, even if the task panicked
/// (then every key as not written, so the next round decides again). The caller has told its
/// tracker the writes are sent.
pub(crate) fn spawn_writes<T, F, Fut>(
    myself: &ActorRef<SupervisorMsg>,
    items: Vec<(String, T)>,
    write: F,
    answer: fn(Vec<(String, Option<String>)>) -> SupervisorMsg,
    ctx: &Arc<Context>,
) where
    T: Send + 'static,
    F: Fn(Arc<Context>, T) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Option<String>> + Send,
{
    if items.is_empty() {
        return;
    }
    let keys: Vec<String> = items.iter().map(|(key, _)| key.clone()).collect();
    let ctx = ctx.clone();
    let writes = tokio::spawn(async move {
        futures::stream::iter(items)
            .map(|(key, item)| {
                let written = write(ctx.clone(), item);
                async move { (key, written.await) }
            })
            .buffer_unordered(PARALLEL_WRITES)
            .collect::<Vec<(String, Option<String>)>>()
            .await
    });
    let supervisor = myself.clone();
    tokio::spawn(async move {
        let written = match writes.await {
            Ok(written) => written,
            // A panicked task wrote who knows what: release every key to the next round.
            Err(_) => keys.into_iter().map(|key| (key, None)).collect(),
        };
        let _ = supervisor.cast(answer(written));
    });
}

/// The resourceVersion a round's write left, for the tracker (`None`: it wrote nothing). A
/// conflict or a missing object means the cache was behind: the next round decides again on the
/// object as it is then. Any other error is logged by `log_failure`, counted in the operator's
/// errors as `error_kind`, and tried again by the next round.
pub(crate) fn version_written<K: kube::Resource>(
    result: Result<K, kube::Error>,
    ctx: &Context,
    error_kind: &str,
    log_failure: impl FnOnce(&kube::Error),
) -> Option<String> {
    match result {
        Ok(written) => written.resource_version(),
        Err(err) if is_conflict(&err) || is_not_found(&err) => None,
        Err(err) => {
            log_failure(&err);
            ctx.error(error_kind);
            None
        }
    }
}
