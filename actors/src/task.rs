//! Background tasks owned by an actor's state: dropped state (even when the actor is killed
//! without `post_stop`) must not leave a watch running.

pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
