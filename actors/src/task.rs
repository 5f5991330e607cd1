//! Background tasks owned by an actor's state: dropped state (even when the actor is killed
//! without `post_stop`) must not leave a watch running.

pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The reconnect backoff of the operator's own few watches (requests, nodes, config, budgets):
/// 0.5 s doubling to at most 5 s, with jitter, reset after a minute without errors. kube's
/// default (client-go's reflector: up to 30 s) kept the operator idle for up to half a minute
/// after an API server came back from a 25 s outage, every node in maintenance waiting with it.
/// The per-node pod watches, one per node in maintenance, keep the gentler default.
pub fn watch_backoff()
-> kube::runtime::utils::ResetTimerBackoff<kube::runtime::watcher::ExponentialBackoff> {
    let exponential = backon::ExponentialBuilder::default()
        .with_min_delay(std::time::Duration::from_millis(500))
        .with_max_delay(std::time::Duration::from_secs(5))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times();
    kube::runtime::utils::ResetTimerBackoff::new(
        exponential.into(),
        std::time::Duration::from_secs(60),
    )
}
