//! The connections the request actors' pod watches go over.
//!
//! Over HTTP/1.1 a watch holds a connection for as long as it lasts, and a connection costs
//! about 40 KiB (TLS state, hyper's buffers and dispatch channel): 500 nodes in maintenance held
//! 20 MiB in pod-watch connections alone. Over HTTP/2 the API server multiplexes watches on one
//! connection, a stream each (a few hundred bytes), as client-go does for its informers. A
//! connection carries at most [`WATCHES_PER_CONNECTION`] of them: past the server's limit of
//! concurrent streams a new watch would wait for one to end, and a node's drain with it. RFC 9113
//! recommends servers allow at least 100; kube-apiserver allows 1,000
//! (`--http2-max-streams-per-connection`). Each connection is its own client (hyper's pool
//! keeps one HTTP/2 connection per client).

use std::sync::{Arc, Mutex};

/// Watches per HTTP/2 connection: the least RFC 9113 recommends a server to allow.
pub const WATCHES_PER_CONNECTION: usize = 100;

/// The pod watches' clients, one connection each, made as the watches need them.
pub struct WatchConnections {
    connect: Box<dyn Fn() -> kube::Client + Send + Sync>,
    /// Each client with its token: one clone per watch on it, plus this one.
    clients: Mutex<Vec<(kube::Client, Arc<()>)>>,
}

/// One watch's place on a connection, given back when it is dropped.
#[derive(Debug)]
pub struct WatchSlot {
    _token: Arc<()>,
}

impl WatchConnections {
    /// `connect` makes a client whose requests share one connection (HTTP/2); it is called once
    /// per [`WATCHES_PER_CONNECTION`] watches at the same time.
    pub fn new(connect: impl Fn() -> kube::Client + Send + Sync + 'static) -> Self {
        WatchConnections {
            connect: Box::new(connect),
            clients: Mutex::new(Vec::new()),
        }
    }

    /// Every watch on `client` (whatever its protocol): what the operator does when the API
    /// server does not speak HTTP/2, and in tests.
    pub fn shared(client: kube::Client) -> Self {
        WatchConnections {
            connect: Box::new(move || client.clone()),
            clients: Mutex::new(Vec::new()),
        }
    }

    /// The client for one more watch, and its slot: hold the slot as long as the watch lives.
    pub fn acquire(&self) -> (kube::Client, WatchSlot) {
        let mut clients = self
            .clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let index = match connection_with_room(&watches_on(&clients), WATCHES_PER_CONNECTION) {
            Some(index) => index,
            None => {
                clients.push(((self.connect)(), Arc::new(())));
                clients.len() - 1
            }
        };
        let (client, token) = &clients[index];
        let slot = WatchSlot {
            _token: token.clone(),
        };
        (client.clone(), slot)
    }

    /// The watches on each connection made so far (an idle one costs nothing until it is used
    /// again: hyper closes it after 90 s without a stream).
    pub fn watches_per_connection(&self) -> Vec<usize> {
        watches_on(
            &self
                .clients
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

fn watches_on(clients: &[(kube::Client, Arc<()>)]) -> Vec<usize> {
    clients
        .iter()
        .map(|(_, token)| Arc::strong_count(token) - 1)
        .collect()
}

/// The connection a new watch goes on, given the watches on each: the first with room (the
/// others empty and close), or `None` for a new one.
pub fn connection_with_room(watches: &[usize], per_connection: usize) -> Option<usize> {
    watches.iter().position(|&n| n < per_connection)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::offline_client;

    #[test]
    fn a_watch_goes_on_the_first_connection_with_room() {
        assert_eq!(connection_with_room(&[], 100), None);
        assert_eq!(connection_with_room(&[100, 99, 3], 100), Some(1));
        assert_eq!(connection_with_room(&[100, 100], 100), None);
        assert_eq!(connection_with_room(&[0], 100), Some(0));
    }

    #[tokio::test]
    async fn a_connection_carries_at_most_its_share_of_watches_and_slots_come_back() {
        let made = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = made.clone();
        let connections = WatchConnections::new(move || {
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            offline_client()
        });
        let mut slots: Vec<WatchSlot> = (0..WATCHES_PER_CONNECTION)
            .map(|_| connections.acquire().1)
            .collect();
        assert_eq!(connections.watches_per_connection(), [100]);
        slots.push(connections.acquire().1);
        assert_eq!(
            connections.watches_per_connection(),
            [100, 1],
            "the 101st watch opens another"
        );
        // A watch that ends gives its place back: the next goes on the first connection.
        slots.swap_remove(0);
        assert_eq!(connections.watches_per_connection(), [99, 1]);
        let _again = connections.acquire();
        assert_eq!(connections.watches_per_connection(), [100, 1]);
        drop(slots);
        assert_eq!(connections.watches_per_connection(), [1, 0]);
        assert_eq!(made.load(std::sync::atomic::Ordering::Relaxed), 2);
    }
}
