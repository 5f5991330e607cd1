//! The supervisor's watches: a reflector store per kind, and one coalesced `Changed` in the
//! mailbox for any number of events.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use ractor::ActorRef;

use crate::supervisor::SupervisorMsg;
use crate::task::AbortOnDrop;

pub(crate) fn spawn_watch<K>(
    api: Api<K>,
    config: watcher::Config,
    strip: impl FnMut(&mut K) + Send + 'static,
    supervisor: ActorRef<SupervisorMsg>,
    queued: Arc<AtomicBool>,
) -> (Store<K>, AbortOnDrop)
where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, config).modify(strip))
        .backoff(crate::task::watch_backoff())
        .touched_objects();
    let task = tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(_) => {
                    // Coalesce: one Changed in the mailbox stands for any number of events.
                    if !queued.swap(true, Ordering::AcqRel) {
                        let _ = supervisor.cast(SupervisorMsg::Changed);
                    }
                }
                Err(err) => tracing::warn!(%err, "watch error; retrying with backoff"),
            }
        }
    });
    (store, AbortOnDrop(task))
}
