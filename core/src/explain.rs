//! Which waiting requests get their "why it waits" message rewritten in this round.
//!
//! The scheduler says why each Pending request waits; the supervisor writes that into the
//! request's Pending condition so `kubectl describe nm` answers "why is my request still
//! Pending?". Reasons carry counts that move with every admission in a busy cluster ("100 nodes
//! are in maintenance"), and a thousand waiting requests rewritten every few seconds would be a
//! steady load on the API server for nothing new. So a message whose cause is the same (still
//! `maxParallelOperations`, with other counts) is refreshed at most every
//! [`SAME_CAUSE_INTERVAL`]; a new cause (the slots are free now, but a window is closed; passed
//! over for a drainable request; a config the operator cannot use) is written at once, in the
//! round that found it, since a stale cause misleads; and at most [`EXPLAIN_PER_ROUND`] per
//! round. A change of
//! the limits is different: a person just edited the config and looks at the requests now, so
//! messages written under the old limits are rewritten at once (still bounded per round; the rest
//! follow in the next rounds without waiting for an interval).

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::time::Duration;

use jiff::Timestamp;

use crate::scheduler::{Limits, WaitCause};

/// How often one request's message may be refreshed while its cause stays the same (only the
/// counts in it moved).
pub const SAME_CAUSE_INTERVAL: Duration = Duration::from_secs(60);
/// Most rewrites in one round, so a config edit in a big cluster is a burst of bounded size.
pub const EXPLAIN_PER_ROUND: usize = 64;

/// When a request's message was last written, under which limits, and for which cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Explained {
    pub at: Timestamp,
    pub limits_epoch: u64,
    pub cause: WaitCause,
}

/// A Pending request that the scheduler left waiting, as the rewrite decision sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitingRequest<'a, K> {
    pub key: K,
    /// Why the scheduler leaves it waiting now.
    pub reason: &'a str,
    pub cause: WaitCause,
    /// The message its Pending condition shows now.
    pub message: &'a str,
    /// When we last rewrote it; `None` if never (or not since it last stopped waiting).
    pub last: Option<Explained>,
}

/// The requests to rewrite now, in the order given (the scheduler's, so the requests next in
/// line are explained first when the round is full). `limits_epoch` counts limit changes: a
/// message written under an earlier epoch is stale at once.
pub fn to_explain<K: Clone>(
    waiting: &[WaitingRequest<'_, K>],
    limits_epoch: u64,
    now: Timestamp,
) -> Vec<K> {
    let passed = |since: Timestamp, interval: Duration| {
        let interval =
            jiff::SignedDuration::try_from(interval).unwrap_or(jiff::SignedDuration::MAX);
        // A clock that went back counts as "just now": wait rather than write twice.
        now.duration_since(since) >= interval
    };
    waiting
        .iter()
        .filter(|w| w.reason != w.message)
        .filter(|w| match w.last {
            None => true,
            Some(last) if last.limits_epoch != limits_epoch => true,
            // A new cause is news: written at once (bounded per round), never left stale.
            Some(last) if last.cause != w.cause => true,
            Some(last) => passed(last.at, SAME_CAUSE_INTERVAL),
        })
        .take(EXPLAIN_PER_ROUND)
        .map(|w| w.key.clone())
        .collect()
}

/// The supervisor's memory between rounds: the limits of the last round and when each waiting
/// request was last explained.
#[derive(Debug, Clone, Default)]
pub struct Explanations<K> {
    limits: Option<Limits>,
    limits_epoch: u64,
    explained: HashMap<K, Explained>,
}

/// One waiting request as the supervisor observed it: its key, the scheduler's reason and cause,
/// and the message its Pending condition shows: `None` while it shows none yet (its first
/// Pending, written with its reason, has not reached the cache). Such a request is remembered,
/// not rewritten.
pub struct Observed<'a, K> {
    pub key: K,
    pub reason: &'a str,
    pub cause: WaitCause,
    pub message: Option<&'a str>,
}

impl<K: Clone + Eq + Hash> Explanations<K> {
    /// Decides this round's rewrites and records them as written now; forgets requests that no
    /// longer wait, so one that waits again later is explained at once.
    pub fn round(
        &mut self,
        limits: &Limits,
        waiting: &[Observed<'_, K>],
        now: Timestamp,
    ) -> Vec<K> {
        if self.limits.as_ref() != Some(limits) {
            // The first round has nothing earlier to compare with, and nothing was explained
            // yet, so counting it as a change costs nothing.
            self.limits_epoch += 1;
            self.limits = Some(limits.clone());
        }
        let still_waiting: HashSet<&K> = waiting.iter().map(|w| &w.key).collect();
        self.explained.retain(|key, _| still_waiting.contains(key));
        // A request whose first Pending is still on its way stays remembered (above) but is no
        // candidate: forgetting it made its next round rewrite the message it had just been
        // given, most of a write per waiting request.
        let candidates: Vec<WaitingRequest<'_, K>> = waiting
            .iter()
            .filter_map(|w| {
                Some(WaitingRequest {
                    key: w.key.clone(),
                    reason: w.reason,
                    cause: w.cause,
                    message: w.message?,
                    last: self.explained.get(&w.key).copied(),
                })
            })
            .collect();
        let chosen = to_explain(&candidates, self.limits_epoch, now);
        let causes: HashMap<&K, WaitCause> = waiting.iter().map(|w| (&w.key, w.cause)).collect();
        for key in &chosen {
            if let Some(&cause) = causes.get(key) {
                self.written(key.clone(), cause, now);
            }
        }
        chosen
    }

    /// Records a message written elsewhere (a new request's first Pending carries its reason):
    /// its next rewrite waits for the interval like any other, instead of following at once
    /// because the counts in the reason moved by one.
    pub fn written(&mut self, key: K, cause: WaitCause, now: Timestamp) {
        self.explained.insert(
            key,
            Explained {
                at: now,
                limits_epoch: self.limits_epoch,
                cause,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::at;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    fn limits(max_parallel_operations: i32) -> Limits {
        Limits {
            max_parallel_operations: IntOrString::Int(max_parallel_operations),
            max_unavailable: None,
            ..Limits::default()
        }
    }

    fn waiting<'a>(
        key: &'static str,
        reason: &'a str,
        message: &'a str,
        last: Option<Explained>,
    ) -> WaitingRequest<'a, &'static str> {
        WaitingRequest {
            key,
            reason,
            cause: SLOTS,
            message,
            last,
        }
    }

    const SLOTS: WaitCause = WaitCause::MaxParallelOperations;

    fn explained(at_second: i64, limits_epoch: u64) -> Option<Explained> {
        Some(Explained {
            at: at(at_second),
            limits_epoch,
            cause: SLOTS,
        })
    }

    #[test]
    fn an_unchanged_message_is_never_rewritten() {
        let list = [waiting("a", "no free slot", "no free slot", None)];
        assert!(to_explain(&list, 0, at(100)).is_empty());
        let list = [waiting(
            "a",
            "no free slot",
            "no free slot",
            explained(0, 0),
        )];
        assert!(to_explain(&list, 1, at(100)).is_empty());
    }

    #[test]
    fn a_request_never_explained_is_rewritten_at_once() {
        let list = [waiting("a", "no free slot", "waiting for admission", None)];
        assert_eq!(to_explain(&list, 0, at(0)), ["a"]);
    }

    /// Only the counts moved (same cause): refreshed once a minute. A new cause (the pass-over,
    /// a closed window, a config error): at once, even a moment after the last write.
    #[test]
    fn same_limits_throttle_only_a_reason_whose_cause_is_the_same() {
        let list = [
            waiting("recent", "new", "old", explained(50, 3)),
            waiting("due", "new", "old", explained(40, 3)),
        ];
        assert_eq!(to_explain(&list, 3, at(100)), ["due"]);
        let window = WaitingRequest {
            cause: WaitCause::MaintenanceWindows,
            ..waiting("new-cause", "window closed", "old", explained(89, 3))
        };
        assert_eq!(
            to_explain(std::slice::from_ref(&window), 3, at(89)),
            ["new-cause"]
        );
        for cause in [WaitCause::DrainBlocked, WaitCause::ConfigError] {
            let changed = WaitingRequest {
                cause,
                ..waiting("changed", "other", "old", explained(100, 3))
            };
            assert_eq!(to_explain(&[changed], 3, at(100)), ["changed"], "{cause:?}");
        }
    }

    #[test]
    fn changed_limits_rewrite_at_once_even_though_explained_1s_ago() {
        let list = [waiting(
            "a",
            "maxParallelOperations=3",
            "maxParallelOperations=2",
            explained(99, 0),
        )];
        assert!(
            to_explain(&list, 0, at(100)).is_empty(),
            "same limits: throttled"
        );
        assert_eq!(to_explain(&list, 1, at(100)), ["a"]);
    }

    #[test]
    fn at_most_a_round_full_in_the_given_order() {
        let names: Vec<String> = (0..EXPLAIN_PER_ROUND + 5)
            .map(|i| format!("r{i:03}"))
            .collect();
        let list: Vec<WaitingRequest<'_, &str>> = names
            .iter()
            .map(|name| WaitingRequest {
                key: name.as_str(),
                reason: "new",
                cause: SLOTS,
                message: "old",
                last: explained(99, 0),
            })
            .collect();
        let chosen = to_explain(&list, 1, at(100));
        let expected: Vec<&str> = names[..EXPLAIN_PER_ROUND]
            .iter()
            .map(String::as_str)
            .collect();
        assert_eq!(chosen, expected);
    }

    #[test]
    fn after_a_limit_change_the_rest_follow_next_round_without_waiting_for_the_interval() {
        let mut memory: Explanations<String> = Explanations::default();
        let names: Vec<String> = (0..EXPLAIN_PER_ROUND + 6)
            .map(|i| format!("r{i:03}"))
            .collect();
        let observe = |names: &[String],
                       reason: &'static str,
                       message: &'static str|
         -> Vec<(String, &'static str, &'static str)> {
            names.iter().map(|n| (n.clone(), reason, message)).collect()
        };
        let run = |memory: &mut Explanations<String>,
                   limits: &Limits,
                   list: &[(String, &str, &str)],
                   now| {
            let observed: Vec<Observed<'_, String>> = list
                .iter()
                .map(|(key, reason, message)| Observed {
                    key: key.clone(),
                    reason,
                    cause: SLOTS,
                    message: Some(message),
                })
                .collect();
            memory.round(limits, &observed, now)
        };

        // Everyone explained under maxParallelOperations=2 (two rounds: the round is bounded).
        let first = observe(&names, "max=2", "waiting for admission");
        assert_eq!(
            run(&mut memory, &limits(2), &first, at(0)).len(),
            EXPLAIN_PER_ROUND
        );
        assert_eq!(run(&mut memory, &limits(2), &first, at(1)).len(), 6);

        // The config is edited 1 s later: every message is stale, a round full goes at once...
        let edited = observe(&names, "max=3", "max=2");
        assert_eq!(
            run(&mut memory, &limits(3), &edited, at(2)).len(),
            EXPLAIN_PER_ROUND
        );
        // ...and the rest in the very next round, 1 s later, although the limits did not change
        // again and all of them were explained 1 s ago.
        let next = run(&mut memory, &limits(3), &edited, at(3));
        assert_eq!(next, names[EXPLAIN_PER_ROUND..].to_vec());
        // Then the interval applies again.
        assert!(
            run(
                &mut memory,
                &limits(3),
                &observe(&names, "max=3 again", "max=3"),
                at(4)
            )
            .is_empty()
        );
    }

    #[test]
    fn a_request_that_stops_waiting_is_forgotten() {
        let mut memory: Explanations<&str> = Explanations::default();
        let observed = |reason| {
            [Observed {
                key: "a",
                reason,
                cause: SLOTS,
                message: Some("old"),
            }]
        };
        assert_eq!(memory.round(&limits(1), &observed("x"), at(0)), ["a"]);
        // Not waiting in this round (admitted, or deleted).
        assert!(memory.round(&limits(1), &[], at(1)).is_empty());
        // Waiting again: explained at once, not an interval after the first time.
        assert_eq!(memory.round(&limits(1), &observed("y"), at(2)), ["a"]);
    }

    /// A new request's first Pending already carries the reason of its first round; when the
    /// counts in the reason move in the next round, the message waits for the interval rather
    /// than being rewritten at once (that was most of a write per waiting request).
    #[test]
    fn a_first_pending_written_elsewhere_is_throttled_like_an_explanation() {
        let mut memory: Explanations<&str> = Explanations::default();
        memory.round(&limits(1), &[], at(0));
        memory.written("a", SLOTS, at(0));
        let observed = [Observed {
            key: "a",
            reason: "2 in maintenance",
            cause: SLOTS,
            message: Some("1 in maintenance"),
        }];
        assert!(memory.round(&limits(1), &observed, at(1)).is_empty());
        assert!(memory.round(&limits(1), &observed, at(59)).is_empty());
        assert_eq!(memory.round(&limits(1), &observed, at(60)), ["a"]);
    }

    /// The rounds between a new request's first Pending write and the cache showing it see the
    /// request waiting with no Pending message: it must stay remembered through them, or the
    /// message it was just given is rewritten as soon as it shows (0.75 writes per request of
    /// the no-drain bench, a second after the first).
    #[test]
    fn a_first_pending_still_on_its_way_is_not_rewritten_when_it_shows() {
        let mut memory: Explanations<&str> = Explanations::default();
        let on_its_way = [Observed {
            key: "a",
            reason: "1 in maintenance",
            cause: SLOTS,
            message: None,
        }];
        assert!(memory.round(&limits(1), &on_its_way, at(0)).is_empty());
        memory.written("a", SLOTS, at(0));
        assert!(memory.round(&limits(1), &on_its_way, at(0)).is_empty());
        let shown = [Observed {
            key: "a",
            reason: "2 in maintenance",
            cause: SLOTS,
            message: Some("1 in maintenance"),
        }];
        assert!(memory.round(&limits(1), &shown, at(1)).is_empty());
        assert_eq!(memory.round(&limits(1), &shown, at(60)), ["a"]);
    }

    /// A request whose cause changes while our previous write to it is on its way is observed
    /// without a message (the shell's rule): remembered under its old cause, and rewritten with
    /// the new one in the first round after the write shows. Chosen while the write was on its
    /// way, it was recorded under the new cause but not written, and its message stayed stale
    /// for a minute (an e2e run caught a node group still saying it waited for its last
    /// member).
    #[test]
    fn a_cause_that_changes_while_a_write_is_on_its_way_is_written_once_it_shows() {
        let mut memory: Explanations<&str> = Explanations::default();
        let seen = |cause, message| {
            [Observed {
                key: "a",
                reason: "the new reason",
                cause,
                message,
            }]
        };
        let other = WaitCause::MaxUnavailable;
        assert_eq!(
            memory.round(&limits(1), &seen(SLOTS, Some("old")), at(0)),
            ["a"]
        );
        assert!(
            memory
                .round(&limits(1), &seen(other, None), at(1))
                .is_empty()
        );
        assert_eq!(
            memory.round(&limits(1), &seen(other, Some("the old reason")), at(2)),
            ["a"]
        );
    }
}
