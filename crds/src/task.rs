//! Tasks as they cross the wire: ids `<subtopology>_<partition>` (as in Kafka Streams), and
//! the state and role a worker reports for each task it holds.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A task is one partition of one sub-topology; it owns one shard of each of its stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId {
    pub subtopology: u32,
    pub partition: i32,
}

impl TaskId {
    pub fn new(subtopology: u32, partition: i32) -> Self {
        Self {
            subtopology,
            partition,
        }
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}_{}", self.subtopology, self.partition)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("invalid task id {0:?}: expected <subtopology>_<partition>, e.g. 0_3")]
pub struct ParseTaskIdError(String);

impl FromStr for TaskId {
    type Err = ParseTaskIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseTaskIdError(s.to_string());
        let (a, b) = s.split_once('_').ok_or_else(err)?;
        Ok(TaskId {
            subtopology: a.parse().map_err(|_| err())?,
            partition: b.parse().map_err(|_| err())?,
        })
    }
}

/// What a worker holds a task for (Kafka Streams' active, standby and warm-up tasks).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TaskRole {
    /// Processes its input partition and writes its stores' changelogs.
    #[default]
    Active,
    /// Keeps a copy of the task's stores up to date from their changelogs, ready to take over
    /// when the active's worker fails (`numStandbyReplicas`).
    Standby,
    /// A standby placed where the task is about to move: it becomes active once within
    /// `warmup.acceptableRecoveryLag` of the changelogs' end.
    Warmup,
}

impl TaskRole {
    pub fn name(self) -> &'static str {
        match self {
            TaskRole::Active => "ACTIVE",
            TaskRole::Standby => "STANDBY",
            TaskRole::Warmup => "WARMUP",
        }
    }
}

impl fmt::Display for TaskRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a task is in its life on a worker (Kafka Streams' task states). An active task goes
/// CREATED → RESTORING → RUNNING (→ SUSPENDED → CLOSED); a standby or warm-up is RUNNING while
/// it follows its changelogs, RESTORING while it catches up from far behind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TaskState {
    #[default]
    Created,
    Restoring,
    Running,
    Suspended,
    Closed,
    /// A state written by a newer worker that this reader does not know; never written.
    #[serde(other)]
    Unknown,
}

impl TaskState {
    /// The name users see in status and metrics.
    pub fn name(self) -> &'static str {
        match self {
            TaskState::Created => "CREATED",
            TaskState::Restoring => "RESTORING",
            TaskState::Running => "RUNNING",
            TaskState::Suspended => "SUSPENDED",
            TaskState::Closed => "CLOSED",
            TaskState::Unknown => "UNKNOWN",
        }
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_garbage() {
        let t = TaskId::new(1, 11);
        assert_eq!(t.to_string(), "1_11");
        assert_eq!("1_11".parse::<TaskId>().ok(), Some(t));
        assert!("1-11".parse::<TaskId>().is_err());
        assert!("x_1".parse::<TaskId>().is_err());
    }

    #[test]
    fn states_and_roles_are_their_names_on_the_wire() {
        assert_eq!(
            serde_json::to_string(&TaskRole::Warmup).ok().as_deref(),
            Some("\"WARMUP\"")
        );
        assert_eq!(
            serde_json::from_str::<TaskState>("\"RESTORING\"").ok(),
            Some(TaskState::Restoring)
        );
        // A state a newer worker writes does not make the whole status unreadable.
        assert_eq!(
            serde_json::from_str::<TaskState>("\"PAUSED\"").ok(),
            Some(TaskState::Unknown)
        );
        for s in [TaskState::Created, TaskState::Running, TaskState::Closed] {
            assert_eq!(serde_json::to_string(&s).ok(), Some(format!("\"{s}\"")));
        }
    }
}
