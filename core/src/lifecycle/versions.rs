//! resourceVersions as the supervisor compares them: whether a cache has caught up with a write.

use maintenance_crds::NodeMaintenance;

/// Compares resourceVersions numerically when they are numbers (etcd's are), else accepts: the
/// supervisor's cache may lag behind the actor's own writes, and the actor only moves forward.
pub fn is_newer_version(candidate: &NodeMaintenance, current: &NodeMaintenance) -> bool {
    let parse = |o: &NodeMaintenance| {
        o.metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
    };
    match (parse(candidate), parse(current)) {
        (Some(a), Some(b)) => a >= b,
        _ => true,
    }
}

/// True when `request` (as a cache shows it) is at resourceVersion `version` or later: a write we
/// made has reached the cache. Versions compare as numbers, as etcd's are; anything else counts as
/// reached, so that nothing waits forever on a version it cannot compare.
pub fn shows_version(request: &NodeMaintenance, version: &str) -> bool {
    version_reached(request.metadata.resource_version.as_deref(), version)
}

/// True when an object a cache shows at resourceVersion `shown` is at `version` or later (see
/// [`shows_version`]).
pub fn version_reached(shown: Option<&str>, version: &str) -> bool {
    let shown = shown.and_then(|v| v.parse::<u64>().ok());
    match (shown, version.parse::<u64>()) {
        (Some(shown), Ok(written)) => shown >= written,
        _ => true,
    }
}
