//! Who may read `/metrics`: the verdict on a caller, from the API server's TokenReview and
//! SubjectAccessReview answers, and how long each verdict is remembered, so that a scrape every
//! few seconds does not cost two API calls each time.
//!
//! This follows controller-runtime's `filters.WithAuthenticationAndAuthorization` (itself the
//! API server's delegating authenticator and authorizer): the caller's bearer token is
//! authenticated, then the user it names is authorized for `get` on the non-resource URL.
//! The shell asks the API server and hashes the token; this module decides and remembers.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// The non-resource URL and verb a scraper must be allowed (`nonResourceURLs: ["/metrics"]`,
/// `verbs: ["get"]`, as the chart's `metrics-reader` ClusterRole grants).
pub const METRICS_PATH: &str = "/metrics";
pub const METRICS_VERB: &str = "get";

/// How long an allowed caller is remembered: the API server's delegating authorizer keeps an
/// allowed answer 5 minutes and a TokenReview 2 minutes; the shorter one bounds both here, so
/// a revoked binding or token stops working within 2 minutes.
pub const ALLOWED_TTL: Duration = Duration::from_secs(120);
/// How long a refused caller is remembered: short, so that a binding just created works at the
/// next scrape but a client retrying a bad token does not cost an API call per request.
pub const REFUSED_TTL: Duration = Duration::from_secs(10);
/// Most callers remembered at once: a flood of random tokens must not grow the memory.
pub const CAPACITY: usize = 1024;

/// The verdict on a request to `/metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// The token is valid and its user may `get` `/metrics`: 200.
    Allowed,
    /// No bearer token, or one the API server does not accept: 401.
    Unauthenticated,
    /// A valid token whose user lacks the right: 403.
    Forbidden,
}

impl Access {
    /// The HTTP status of the answer.
    pub fn status(self) -> u16 {
        match self {
            Access::Allowed => 200,
            Access::Unauthenticated => 401,
            Access::Forbidden => 403,
        }
    }

    /// The `verdict` label of the metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Allowed => "allowed",
            Access::Unauthenticated => "unauthenticated",
            Access::Forbidden => "forbidden",
        }
    }

    /// What the caller is told: what is missing and how to get it.
    pub fn message(self) -> &'static str {
        match self {
            Access::Allowed => "",
            Access::Unauthenticated => {
                "/metrics needs a bearer token the Kubernetes API server accepts (e.g. a \
                 ServiceAccount token: Authorization: Bearer <token>)"
            }
            Access::Forbidden => {
                "the token's user may not get the non-resource URL /metrics; bind the chart's \
                 metrics-reader ClusterRole to it"
            }
        }
    }

    fn ttl(self) -> Duration {
        match self {
            Access::Allowed => ALLOWED_TTL,
            Access::Unauthenticated | Access::Forbidden => REFUSED_TTL,
        }
    }
}

/// What the API server answered about a caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reviewed {
    /// The TokenReview did not authenticate the token (no SubjectAccessReview follows).
    NotAuthenticated,
    /// The token is authenticated; `allowed` is the SubjectAccessReview's answer.
    Authenticated { allowed: bool },
}

/// The verdict on the API server's answers.
pub fn verdict(reviewed: Reviewed) -> Access {
    match reviewed {
        Reviewed::NotAuthenticated => Access::Unauthenticated,
        Reviewed::Authenticated { allowed: true } => Access::Allowed,
        Reviewed::Authenticated { allowed: false } => Access::Forbidden,
    }
}

/// The verdicts remembered, by a key of the caller's token (a digest: the cache never holds a
/// token itself). Time is passed in.
#[derive(Debug)]
pub struct AccessCache<K> {
    entries: HashMap<K, (Access, Instant)>,
    capacity: usize,
}

impl<K: Hash + Eq + Clone> Default for AccessCache<K> {
    fn default() -> Self {
        AccessCache::with_capacity(CAPACITY)
    }
}

impl<K: Hash + Eq + Clone> AccessCache<K> {
    pub fn with_capacity(capacity: usize) -> Self {
        AccessCache {
            entries: HashMap::new(),
            capacity: capacity.max(1),
        }
    }

    /// The verdict remembered for `key`, if it has not expired at `now`.
    pub fn lookup(&self, key: &K, now: Instant) -> Option<Access> {
        self.entries
            .get(key)
            .filter(|(_, expires)| now < *expires)
            .map(|(access, _)| *access)
    }

    /// Remembers `access` for `key` from `now` for the verdict's time to live. When full, the
    /// expired entries go first, then the one that would expire soonest.
    pub fn record(&mut self, key: K, access: Access, now: Instant) {
        if self.entries.len() >= self.capacity && !self.entries.contains_key(&key) {
            self.entries.retain(|_, (_, expires)| now < *expires);
            if self.entries.len() >= self.capacity
                && let Some(soonest) = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (_, expires))| *expires)
                    .map(|(key, _)| key.clone())
            {
                self.entries.remove(&soonest);
            }
        }
        self.entries.insert(key, (access, now + access.ttl()));
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The bearer token of an `Authorization` header value, if it carries one (the scheme is
/// case-insensitive, as RFC 7235 says).
pub fn bearer_token(authorization: &str) -> Option<&str> {
    let (scheme, token) = authorization.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_follow_the_reviews() {
        assert_eq!(verdict(Reviewed::NotAuthenticated), Access::Unauthenticated);
        assert_eq!(
            verdict(Reviewed::Authenticated { allowed: false }),
            Access::Forbidden
        );
        assert_eq!(
            verdict(Reviewed::Authenticated { allowed: true }),
            Access::Allowed
        );
        assert_eq!(Access::Unauthenticated.status(), 401);
        assert_eq!(Access::Forbidden.status(), 403);
        assert_eq!(Access::Allowed.status(), 200);
    }

    #[test]
    fn an_allowed_caller_is_remembered_longer_than_a_refused_one() {
        let start = Instant::now();
        let mut cache = AccessCache::default();
        cache.record("good", Access::Allowed, start);
        cache.record("bad", Access::Forbidden, start);
        let later = start + REFUSED_TTL;
        assert_eq!(cache.lookup(&"good", later), Some(Access::Allowed));
        assert_eq!(cache.lookup(&"bad", later), None, "refusals expire first");
        assert_eq!(cache.lookup(&"good", start + ALLOWED_TTL), None);
        assert_eq!(cache.lookup(&"unknown", start), None);
    }

    #[test]
    fn a_full_cache_drops_the_expired_then_the_soonest_to_expire() {
        let start = Instant::now();
        let mut cache = AccessCache::with_capacity(2);
        cache.record(1, Access::Unauthenticated, start);
        cache.record(2, Access::Allowed, start);
        // 1 has expired: it makes room.
        let later = start + REFUSED_TTL;
        cache.record(3, Access::Allowed, later);
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.lookup(&2, later), Some(Access::Allowed));
        assert_eq!(cache.lookup(&3, later), Some(Access::Allowed));
        // Nothing expired: 2 expires before 3 and goes.
        cache.record(4, Access::Forbidden, later);
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.lookup(&2, later), None);
        assert_eq!(cache.lookup(&3, later), Some(Access::Allowed));
        assert_eq!(cache.lookup(&4, later), Some(Access::Forbidden));
    }

    #[test]
    fn a_caller_recorded_again_keeps_one_entry() {
        let start = Instant::now();
        let mut cache = AccessCache::with_capacity(1);
        cache.record("a", Access::Forbidden, start);
        cache.record("a", Access::Allowed, start);
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.lookup(&"a", start), Some(Access::Allowed));
    }

    #[test]
    fn bearer_tokens_are_read_from_the_header() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer  abc "), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer"), None);
        assert_eq!(bearer_token("Bearer   "), None);
        assert_eq!(bearer_token(""), None);
    }
}
