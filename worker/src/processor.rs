//! The Processor API: what the declarative steps are built on, and what a user embedding
//! eddy implements for custom logic. A processor sees one record at a time, reads and writes
//! the task's stores through a record cache, forwards records to the next processor, or
//! sends them to a topic.

use crate::cache::StoreState;
use crate::record::Record;
use crate::store::{StoreError, TaskDb};

/// Why a record could not be processed.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The record itself is bad (undecodable, an expression failed on it): `onError` decides.
    #[error("{0}")]
    BadRecord(String),
    /// The record carries nothing to process (e.g. a null key in an aggregation): counted
    /// as skipped whatever `onError` says, as Kafka Streams drops such records.
    #[error("{0}")]
    Skip(String),
    /// Kafka did not take a record for a reason that is not the record's (an outage, a
    /// fenced producer): the worker retries from its last commit, or stops if it cannot.
    #[error("cannot send to {topic}[{partition}]: {source}")]
    Send {
        topic: String,
        partition: i32,
        #[source]
        source: rdkafka::error::KafkaError,
    },
    /// Anything else stops the worker.
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Fatal(String),
}

impl ProcessError {
    pub fn bad(e: impl std::fmt::Display) -> Self {
        ProcessError::BadRecord(e.to_string())
    }
}

/// A step of a sub-topology. Implement it to run custom logic with access to the stores.
pub trait Processor: Send {
    fn process(&mut self, record: Record, ctx: &mut Context<'_>) -> Result<(), ProcessError>;
}

/// Where processors send records destined for a topic.
pub trait Sink {
    /// Partition is computed from the key bytes with Kafka's murmur2 unless given.
    fn send(
        &mut self,
        topic: &str,
        partition: Option<i32>,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        timestamp: i64,
    ) -> Result<(), ProcessError>;

    /// The partition `send` would give a record with this key; `None` leaves the choice to
    /// `send` (a sink that does not partition).
    fn partition_of(&self, _topic: &str, _key: &[u8]) -> Result<Option<i32>, ProcessError> {
        Ok(None)
    }
}

/// What a processor can do while it handles one record.
pub struct Context<'a> {
    pub(crate) stores: &'a mut [StoreState],
    pub(crate) db: Option<&'a TaskDb>,
    pub(crate) sink: &'a mut dyn Sink,
    pub(crate) out: &'a mut Vec<Record>,
}

impl<'a> Context<'a> {
    /// Pass a record to the next processor of the sub-topology.
    pub fn forward(&mut self, record: Record) {
        self.out.push(record);
    }

    /// Write a record to a topic (within the task's transaction under exactly-once).
    pub fn send(
        &mut self,
        topic: &str,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        timestamp: i64,
    ) -> Result<(), ProcessError> {
        self.sink.send(topic, None, key, value, timestamp)
    }

    /// Write a record to the partition of `partition_key` rather than of its own key: a
    /// windowed key goes where its inner key does, as Kafka Streams' `WindowedStreamPartitioner`
    /// sends it.
    pub fn send_partitioned_by(
        &mut self,
        topic: &str,
        partition_key: &[u8],
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        timestamp: i64,
    ) -> Result<(), ProcessError> {
        let partition = self.sink.partition_of(topic, partition_key)?;
        self.sink.send(topic, partition, key, value, timestamp)
    }

    /// The task's shard of a store.
    pub fn store(&mut self, name: &str) -> Result<KeyValueStore<'_>, ProcessError> {
        let state = self
            .stores
            .iter_mut()
            .find(|s| s.name == name)
            .ok_or_else(|| StoreError::Unknown(name.to_string()))?;
        Ok(KeyValueStore { state, db: self.db })
    }
}

/// A key-value store as a processor sees it: reads go through the record cache, writes land
/// in the cache and reach the changelog and RocksDB at commit.
pub struct KeyValueStore<'a> {
    state: &'a mut StoreState,
    db: Option<&'a TaskDb>,
}

impl KeyValueStore<'_> {
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, ProcessError> {
        Ok(self.state.get(self.db, key)?)
    }

    pub fn put(&mut self, key: &[u8], value: &[u8], timestamp: i64) {
        self.state.put(key, Some(value.to_vec()), timestamp);
    }

    pub fn delete(&mut self, key: &[u8], timestamp: i64) {
        self.state.put(key, None, timestamp);
    }

    /// A window store's window starting at `start` was written: expiry counts the store's
    /// retention back from the latest such start.
    pub fn observe_window(&mut self, start: i64) {
        self.state.observe(start);
    }
}
