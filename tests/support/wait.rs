//! Unique names and waiting: every wait has a deadline and polls the cluster, tests never sleep
//! for a fixed time.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Result, bail};

/// How often `wait_for` polls.
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// A DNS-1123 label `<prefix>-<tag>-<n>`: `tag` differs between processes (so tests sharing a
/// testbed through `MO_TESTBED_DIR` do not collide) and `n` between calls.
pub fn unique_name(prefix: &str) -> String {
    static TAG: OnceLock<String> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let tag = TAG.get_or_init(|| {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos() as u64 ^ d.as_secs())
            .unwrap_or_default();
        base36((u64::from(std::process::id()) << 20 ^ nanos) % 36u64.pow(5))
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut head: String = prefix
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let tail = format!("-{tag}-{}", base36(n));
    head.truncate(63 - tail.len());
    let head = head.trim_matches('-');
    let head = if head.is_empty() { "t" } else { head };
    format!("{head}{tail}")
}

fn base36(mut n: u64) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

/// Outcome of one look at the cluster for [`wait_until`].
pub enum Check<T> {
    Done(T),
    /// Not there yet; the text says what was seen, for the timeout error.
    Pending(String),
}

/// Polls `f` every [`POLL_INTERVAL`] until it returns `Some`; errors from `f` count as "not yet".
/// After `timeout` it fails naming `what` and the last error.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    wait_until(what, timeout, move || {
        let fut = f();
        async move {
            Ok(match fut.await? {
                Some(v) => Check::Done(v),
                None => Check::Pending("condition not met".into()),
            })
        }
    })
    .await
}

/// Like [`wait_for`], with the last observed state in the timeout error.
pub async fn wait_until<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Check<T>>>,
{
    let start = Instant::now();
    let deadline = start + timeout;
    let mut last: String;
    loop {
        match f().await {
            Ok(Check::Done(v)) => return Ok(v),
            Ok(Check::Pending(state)) => last = state,
            Err(e) => last = format!("error: {e:#}"),
        }
        if Instant::now() >= deadline {
            bail!(
                "timed out after {:.1}s waiting for {what}; last seen: {last}",
                start.elapsed().as_secs_f64()
            );
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

pub(crate) fn labels_map(labels: &[(&str, &str)]) -> BTreeMap<String, String> {
    labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// `k=v,k2=v2`, for list calls.
pub fn selector_string(labels: &[(&str, &str)]) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}
