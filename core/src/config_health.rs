//! What the operator tells about its MaintenanceOperatorConfig beyond the Pending messages: a
//! Warning Event on the config when a round finds a value it cannot use, and a Normal one when it
//! is usable again. Once per change, not once per round: rounds run many times a second.

use crate::scheduler::ScheduleError;

/// An Event to post on the config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigEvent {
    pub reason: ConfigEventReason,
    /// The field at fault (`maintenanceWindows[1].schedule`), or `Schedule` when fixed: the
    /// Event's action, which keeps Events about different fields apart (the recorder folds Events
    /// of one reason and action into a series that keeps its first note).
    pub action: String,
    pub note: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigEventReason {
    /// A value cannot be used: nothing is admitted until it is fixed.
    InvalidConfig,
    /// The config is usable again after an `InvalidConfig`.
    ConfigFixed,
}

impl ConfigEventReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ConfigEventReason::InvalidConfig => "InvalidConfig",
            ConfigEventReason::ConfigFixed => "ConfigFixed",
        }
    }

    pub fn is_warning(self) -> bool {
        self == ConfigEventReason::InvalidConfig
    }
}

/// The last problem reported, so that each change is reported once.
#[derive(Debug, Clone, Default)]
pub struct ConfigHealth {
    reported: Option<String>,
}

impl ConfigHealth {
    /// What to post after a round that found `problem` (`None`: the config was usable).
    pub fn observe(&mut self, problem: Option<&ScheduleError>) -> Option<ConfigEvent> {
        let message = problem.map(ToString::to_string);
        if message == self.reported {
            return None;
        }
        let event = match problem {
            Some(problem) => ConfigEvent {
                reason: ConfigEventReason::InvalidConfig,
                action: problem.field(),
                note: format!("nothing is admitted until the config is fixed: {problem}"),
            },
            None => ConfigEvent {
                reason: ConfigEventReason::ConfigFixed,
                action: "Schedule".to_string(),
                note: "the config is usable again: admission resumes".to_string(),
            },
        };
        self.reported = message;
        Some(event)
    }

    /// Whether the config could not be used at the last round (the `config_invalid` gauge).
    pub fn invalid(&self) -> bool {
        self.reported.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::windows::WindowError;

    fn window_error(index: usize) -> ScheduleError {
        ScheduleError::InvalidWindow(WindowError {
            index,
            field: "timeZone",
            value: "Mars/Olympus_Mons".into(),
            problem: "is not an IANA time zone name".into(),
        })
    }

    #[test]
    fn each_change_is_reported_once() {
        let mut health = ConfigHealth::default();
        assert_eq!(
            health.observe(None),
            None,
            "usable from the start: nothing to say"
        );
        let first = health.observe(Some(&window_error(0))).expect("reported");
        assert_eq!(first.reason, ConfigEventReason::InvalidConfig);
        assert!(first.reason.is_warning());
        assert_eq!(first.action, "maintenanceWindows[0].timeZone");
        assert!(
            first.note.contains("\"Mars/Olympus_Mons\""),
            "{}",
            first.note
        );
        assert!(health.invalid());
        assert_eq!(
            health.observe(Some(&window_error(0))),
            None,
            "the same, again"
        );
        let other = health
            .observe(Some(&window_error(3)))
            .expect("a new problem");
        assert_eq!(other.action, "maintenanceWindows[3].timeZone");
        let fixed = health.observe(None).expect("fixed");
        assert_eq!(fixed.reason, ConfigEventReason::ConfigFixed);
        assert!(!fixed.reason.is_warning());
        assert!(!health.invalid());
        assert_eq!(health.observe(None), None);
    }
}
