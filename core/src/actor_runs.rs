//! When the supervisor starts a node actor for a request, forwards a newer version of the request
//! to the one running, or leaves it be.
//!
//! The supervisor decides on its cache, and the cache lags behind what the actors already saw: an
//! actor starts from the version its admission wrote, reads the request again on a conflict, and
//! writes versions of its own. So a version the cache shows may be older than one an actor has
//! seen, and an actor that finished (node uncordoned, finalizer off) may still see its request
//! shown at a version from before its cleanup. A new actor started from such a version would do
//! the work again: cordon the node of a request already gone (nothing would uncordon it), or undo
//! the cordon of the next request on that node. Hence two rules:
//!
//! - what a running actor was given only moves forward (an older cached version is not news);
//! - an actor that ended leaves the version it reached, and only a newer version (or its node
//!   back, once the cache has caught up) starts another; a request the API server said is gone
//!   starts none.
//!
//! An actor that failed is forgotten and starts again after a backoff
//! ([`restart_after_failure`]).

use std::time::Duration;

use crate::lifecycle::version_reached;

/// How a node actor's run ended, as it leaves it for the supervisor before it stops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEnd {
    /// Nothing was left to do for the request at `version`, the last version the actor wrote or
    /// read: its cleanup is done, or its node is gone (`node_gone`).
    Finished {
        version: Option<String>,
        node_gone: bool,
    },
    /// The API server said the request no longer exists.
    RequestGone,
}

impl RunEnd {
    /// The same end, at the newer of its own version and `seen` (a version the supervisor
    /// forwarded, which the actor may not have stepped on before it stopped).
    pub fn at_least(self, seen: Option<&str>) -> RunEnd {
        match self {
            RunEnd::Finished { version, node_gone } if is_after(seen, version.as_deref()) => {
                RunEnd::Finished {
                    version: seen.map(str::to_string),
                    node_gone,
                }
            }
            other => other,
        }
    }
}

/// What the supervisor knows of the actor of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActorRun<'a> {
    /// No actor runs, and none ended that the supervisor remembers (a failed one is forgotten,
    /// so that it restarts).
    Never,
    /// An actor runs; `forwarded` is the newest version it was given.
    Running { forwarded: Option<&'a str> },
    /// An actor ended this way; the supervisor remembers it while its cache shows the request.
    Ended(&'a RunEnd),
}

/// What the supervisor does for a request the cache shows at some version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActorAction {
    /// Start an actor from the cached version.
    Start,
    /// Give the running actor the cached version.
    Forward,
    /// Nothing new in the request, but its node is gone: the running actor steps at once, so a
    /// request that waits for nothing else (Ready) releases the node's slot.
    Step,
    Nothing,
}

/// The supervisor's move for a request that needs an actor (`lifecycle::needs_actor`), shown by
/// the cache at resourceVersion `cached`.
pub fn next_action(run: ActorRun<'_>, cached: Option<&str>, node_exists: bool) -> ActorAction {
    match run {
        ActorRun::Never => ActorAction::Start,
        ActorRun::Running { forwarded } if is_after(cached, forwarded) => ActorAction::Forward,
        ActorRun::Running { .. } if !node_exists => ActorAction::Step,
        ActorRun::Running { .. } => ActorAction::Nothing,
        ActorRun::Ended(RunEnd::RequestGone) => ActorAction::Nothing,
        ActorRun::Ended(RunEnd::Finished { version, node_gone }) => {
            let version = version.as_deref();
            // The node back under its name is work again, even with the request unchanged; but
            // only from a version the cache shows at least as new as the one the actor left.
            let node_back =
                *node_gone && node_exists && version.is_none_or(|v| version_reached(cached, v));
            if is_after(cached, version) || node_back {
                ActorAction::Start
            } else {
                ActorAction::Nothing
            }
        }
    }
}

/// The first restart of a failed actor waits this long, doubled for each failure in a row.
pub const RESTART_MIN: Duration = Duration::from_secs(1);
/// The longest wait before a failed actor starts again.
pub const RESTART_MAX: Duration = Duration::from_secs(60);
/// An actor that ran this long after its last restart failed anew, not again: its backoff
/// starts over, so a rare failure in a maintenance of hours is not met with the longest wait.
pub const RESTART_QUIET: Duration = Duration::from_secs(300);

/// After an actor failed: its failures in a row, counting this one, and how long to wait before
/// it starts again. `previous` is the count so far and how long the actor ran since its last
/// restart (`None`: it never failed).
pub fn restart_after_failure(previous: Option<(u32, Duration)>) -> (u32, Duration) {
    let in_a_row = match previous {
        Some((count, ran_for)) if ran_for < RESTART_QUIET => count.saturating_add(1),
        _ => 1,
    };
    let delay = RESTART_MIN
        .saturating_mul(2u32.saturating_pow(in_a_row.saturating_sub(1).min(16)))
        .min(RESTART_MAX);
    (in_a_row, delay)
}

/// True when resourceVersion `candidate` is newer than `mark` (none yet counts as older than
/// any). Versions compare as numbers, as etcd's are; others only as different.
pub fn is_after(candidate: Option<&str>, mark: Option<&str>) -> bool {
    let Some(candidate) = candidate else {
        return false;
    };
    let Some(mark) = mark else { return true };
    match (candidate.parse::<u64>(), mark.parse::<u64>()) {
        (Ok(candidate), Ok(mark)) => candidate > mark,
        _ => candidate != mark,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finished(version: &str, node_gone: bool) -> RunEnd {
        RunEnd::Finished {
            version: Some(version.to_string()),
            node_gone,
        }
    }

    /// The sequence that left a node cordoned (e2e_faults
    /// `a_request_deleted_as_soon_as_it_is_admitted_leaves_its_node_schedulable`): the admission
    /// writes version 5 and its actor starts from it; the cache, behind, still shows the created
    /// version 3; the requestor deletes the request (version 7), the actor meets the deletion on
    /// a conflict, uncordons and takes its finalizer off (version 8) and finishes; then the cache
    /// shows 5, then 7. The supervisor used to forward 3 (moving its guard back), then start a
    /// new actor from 5, which cordoned the node of a request about to vanish.
    #[test]
    fn late_cached_versions_of_a_request_whose_cleanup_is_done_start_nothing() {
        let forwarded = Some("5");
        assert_eq!(
            next_action(ActorRun::Never, forwarded, true),
            ActorAction::Start,
            "the admission's version starts the actor"
        );
        assert_eq!(
            next_action(ActorRun::Running { forwarded }, Some("3"), true),
            ActorAction::Nothing,
            "an older cached version is not news to the running actor"
        );
        let end = finished("8", false).at_least(forwarded);
        assert_eq!(end, finished("8", false));
        for cached in ["3", "5", "7", "8"] {
            assert_eq!(
                next_action(ActorRun::Ended(&end), Some(cached), true),
                ActorAction::Nothing,
                "version {cached}, from before the cleanup's last write, must not start another \
                 actor"
            );
        }
    }

    #[test]
    fn an_ended_actor_leaves_at_least_the_version_it_was_given() {
        assert_eq!(
            finished("4", false).at_least(Some("6")),
            finished("6", false)
        );
        assert_eq!(finished("9", true).at_least(Some("6")), finished("9", true));
        assert_eq!(
            RunEnd::Finished {
                version: None,
                node_gone: false
            }
            .at_least(Some("6")),
            finished("6", false)
        );
        assert_eq!(RunEnd::RequestGone.at_least(Some("6")), RunEnd::RequestGone);
    }

    #[test]
    fn a_newer_version_after_the_end_is_work_again() {
        let end = finished("8", false);
        assert_eq!(
            next_action(ActorRun::Ended(&end), Some("9"), true),
            ActorAction::Start
        );
    }

    #[test]
    fn a_request_the_api_server_said_is_gone_never_starts_again() {
        for cached in ["1", "100"] {
            assert_eq!(
                next_action(ActorRun::Ended(&RunEnd::RequestGone), Some(cached), true),
                ActorAction::Nothing
            );
        }
    }

    #[test]
    fn a_node_back_under_its_name_restarts_once_the_cache_shows_the_release() {
        let end = finished("9", true);
        assert_eq!(
            next_action(ActorRun::Ended(&end), Some("9"), false),
            ActorAction::Nothing,
            "the node is still gone"
        );
        assert_eq!(
            next_action(ActorRun::Ended(&end), Some("8"), true),
            ActorAction::Nothing,
            "the cache does not show the release yet"
        );
        assert_eq!(
            next_action(ActorRun::Ended(&end), Some("9"), true),
            ActorAction::Start
        );
        let cleaned_up = finished("9", false);
        assert_eq!(
            next_action(ActorRun::Ended(&cleaned_up), Some("9"), true),
            ActorAction::Nothing,
            "an end that was not the node's leaves nothing to do when the node is there"
        );
    }

    #[test]
    fn a_running_actor_gets_newer_versions_and_a_step_when_its_node_goes() {
        let running = ActorRun::Running {
            forwarded: Some("5"),
        };
        assert_eq!(next_action(running, Some("6"), true), ActorAction::Forward);
        assert_eq!(next_action(running, Some("6"), false), ActorAction::Forward);
        assert_eq!(next_action(running, Some("5"), true), ActorAction::Nothing);
        assert_eq!(next_action(running, Some("5"), false), ActorAction::Step);
        assert_eq!(
            next_action(ActorRun::Running { forwarded: None }, Some("1"), true),
            ActorAction::Forward
        );
    }

    #[test]
    fn failed_actors_back_off_and_start_over_after_a_quiet_run() {
        let soon = Duration::from_secs(2);
        assert_eq!(restart_after_failure(None), (1, RESTART_MIN));
        assert_eq!(restart_after_failure(Some((1, soon))), (2, 2 * RESTART_MIN));
        assert_eq!(restart_after_failure(Some((3, soon))), (4, 8 * RESTART_MIN));
        assert_eq!(restart_after_failure(Some((40, soon))), (41, RESTART_MAX));
        assert_eq!(
            restart_after_failure(Some((u32::MAX, soon))),
            (u32::MAX, RESTART_MAX)
        );
        assert_eq!(
            restart_after_failure(Some((40, RESTART_QUIET))),
            (1, RESTART_MIN),
            "the counts used to grow for the whole life of the request"
        );
    }

    #[test]
    fn versions_compare_as_numbers_and_otherwise_as_different() {
        assert!(is_after(Some("10"), Some("9")), "not as text");
        assert!(!is_after(Some("9"), Some("10")));
        assert!(!is_after(Some("9"), Some("9")));
        assert!(is_after(Some("b"), Some("a")));
        assert!(!is_after(Some("a"), Some("a")));
        assert!(is_after(Some("1"), None));
        assert!(!is_after(None, Some("1")));
        assert!(!is_after(None, None));
    }
}
