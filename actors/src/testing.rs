//! Helpers for this crate's unit tests.

/// A kube client that is never contacted: nothing listens on port 9 of localhost, so a request
/// that is sent fails at once (a watch task then retries with backoff), and building the client
/// needs no connection.
pub(crate) fn offline_client() -> kube::Client {
    let url = "http://127.0.0.1:9".parse().expect("a valid URL");
    kube::Client::try_from(kube::Config::new(url)).expect("a client for a plain-HTTP URL")
}
