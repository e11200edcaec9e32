//! Task ids: `<subtopology>_<partition>`, as in Kafka Streams.

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
}
