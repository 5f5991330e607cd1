//! What a node actor says when a step fails: which call failed and on what, the API server's
//! answer, when it is tried again and, where the answer says it, what to do. The same words go
//! to the log, to a Warning Event `StepFailed` on the request (so `kubectl describe` shows a
//! deletion stuck on an uncordon that a webhook refuses), and to the status while only the
//! admission shows the request Scheduled (`lifecycle::status_after_failed_step`).

use std::fmt;
use std::time::Duration;

use crate::lifecycle::Action;

/// The API call of a step that can fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepCall {
    ReadNode,
    Cordon,
    Uncordon,
    /// The autoscaler annotations of a node we do not cordon, written or removed.
    ProtectFromAutoscalers,
    UnprotectFromAutoscalers,
    /// One of our annotations: initial state, adoption, ready time.
    AnnotateRequest,
    AddFinalizer,
    WriteStatus,
    RemoveFinalizer,
    /// The yield's metadata write (a drain that budgets block gives its slot back).
    GiveSlotBack,
    /// Whether the cluster is OpenShift (the Infrastructure `cluster`).
    DetectOpenShift,
    /// The node's MachineConfigPool: its MachineConfig, or the pool.
    ReadPool,
    /// The request's label naming its node's pool.
    LabelPool,
    PausePool,
    /// The pool at a release: read it and its holders, unpause it.
    ReleasePool,
}

impl StepCall {
    /// The call an action makes, if it makes one whose failure ends the step (evictions and
    /// events are answered, or sent, in the background).
    pub fn of(action: &Action) -> Option<StepCall> {
        match action {
            Action::RecordInitialState { .. }
            | Action::Adopt { .. }
            | Action::RecordReadyTime { .. } => Some(StepCall::AnnotateRequest),
            Action::AddFinalizer => Some(StepCall::AddFinalizer),
            Action::Cordon => Some(StepCall::Cordon),
            Action::Uncordon => Some(StepCall::Uncordon),
            Action::ProtectFromAutoscalers => Some(StepCall::ProtectFromAutoscalers),
            Action::UnprotectFromAutoscalers => Some(StepCall::UnprotectFromAutoscalers),
            Action::WriteStatus(_) => Some(StepCall::WriteStatus),
            Action::RemoveFinalizer { .. } => Some(StepCall::RemoveFinalizer),
            Action::Yield { .. } => Some(StepCall::GiveSlotBack),
            Action::LabelPool { .. } => Some(StepCall::LabelPool),
            Action::PausePool(_) => Some(StepCall::PausePool),
            Action::ReleasePool { .. } => Some(StepCall::ReleasePool),
            Action::Evict(_)
            | Action::ForceDelete(_)
            | Action::Event(_)
            | Action::DrainFinished { .. } => None,
        }
    }
}

/// A call of a step, on its target.
pub struct OnTarget<'a> {
    pub call: StepCall,
    pub node: &'a str,
}

impl fmt::Display for OnTarget<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let node = self.node;
        match self.call {
            StepCall::ReadNode => write!(f, "read node {node}"),
            StepCall::Cordon => write!(f, "cordon node {node}"),
            StepCall::Uncordon => write!(f, "uncordon node {node}"),
            StepCall::ProtectFromAutoscalers => {
                write!(f, "annotate node {node} to keep the autoscalers off")
            }
            StepCall::UnprotectFromAutoscalers => {
                write!(f, "remove our autoscaler annotations from node {node}")
            }
            StepCall::AnnotateRequest => f.write_str("annotate the request"),
            StepCall::AddFinalizer => f.write_str("add our finalizer to the request"),
            StepCall::WriteStatus => f.write_str("write the request's status"),
            StepCall::RemoveFinalizer => f.write_str("remove our finalizer from the request"),
            StepCall::DetectOpenShift => f.write_str(
                "read the Infrastructure cluster (config.openshift.io) to detect OpenShift",
            ),
            StepCall::ReadPool => write!(f, "read the MachineConfigPool of node {node}"),
            StepCall::LabelPool => f.write_str("label the request with its MachineConfigPool"),
            StepCall::PausePool => write!(f, "pause the MachineConfigPool of node {node}"),
            StepCall::ReleasePool => write!(
                f,
                "release the MachineConfigPool the request paused (read it and its requests, \
                 unpause it)"
            ),
            StepCall::GiveSlotBack => f.write_str(
                "give the request's slot back (remove our finalizer and admission annotations)",
            ),
        }
    }
}

/// The message of a failed step: `call` on `node` (the request's) was answered `code` and
/// `error`, and the step runs again in `retry_in`.
pub fn message(
    call: Option<StepCall>,
    node: &str,
    code: Option<u16>,
    error: &str,
    retry_in: Duration,
) -> String {
    let what = match call {
        Some(call) => format!("could not {}", OnTarget { call, node }),
        None => "the step failed".to_string(),
    };
    let hint = match code {
        Some(403) => {
            "; the operator's ClusterRole (or an admission policy) does not allow it: fix that \
             and the step goes on by itself"
        }
        _ => "",
    };
    format!(
        "{what} ({error}){hint}; tried again in {}",
        seconds(retry_in)
    )
}

/// Whether the `consecutive`-th failure in a row (1 for the first) is also sent as a Warning
/// Event: the first, then each time the count doubles, so a call that keeps failing is seen at
/// once and again now and then, without an Event on every retry.
pub fn reported(consecutive: u32) -> bool {
    consecutive.is_power_of_two()
}

fn seconds(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 10.0 {
        format!("{s:.1} s")
    } else {
        format!("{s:.0} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_the_call_its_target_and_the_retry() {
        let text = message(
            Some(StepCall::Uncordon),
            "node-7",
            Some(400),
            "admission webhook \"nodes.example.com\" denied the request",
            Duration::from_millis(2_000),
        );
        assert_eq!(
            text,
            "could not uncordon node node-7 (admission webhook \"nodes.example.com\" denied the \
             request); tried again in 2.0 s"
        );
    }

    #[test]
    fn a_forbidden_call_says_what_to_fix() {
        let text = message(
            Some(StepCall::WriteStatus),
            "node-7",
            Some(403),
            "forbidden",
            Duration::from_secs(30),
        );
        assert!(
            text.starts_with(
                "could not write the request's status (forbidden); the operator's ClusterRole"
            ),
            "{text}"
        );
        assert!(text.ends_with("tried again in 30 s"), "{text}");
    }

    #[test]
    fn every_call_that_can_end_a_step_is_named() {
        use crate::lifecycle::Action;
        assert_eq!(StepCall::of(&Action::Cordon), Some(StepCall::Cordon));
        assert_eq!(
            StepCall::of(&Action::RecordInitialState {
                unschedulable: false
            }),
            Some(StepCall::AnnotateRequest)
        );
        assert_eq!(StepCall::of(&Action::Evict(Vec::new())), None);
        assert_eq!(
            message(None, "n", None, "e", Duration::ZERO),
            "the step failed (e); tried again in 0.0 s"
        );
    }

    #[test]
    fn failures_are_reported_at_first_then_each_time_the_count_doubles() {
        let reported: Vec<u32> = (1..=40).filter(|n| reported(*n)).collect();
        assert_eq!(reported, vec![1, 2, 4, 8, 16, 32]);
    }
}
