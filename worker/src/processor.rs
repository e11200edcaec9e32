//! The Processor API: what the declarative steps are built on, and what a user embedding
//! eddy implements for custom logic. A processor sees one record at a time, reads and writes
//! the task's stores through a record cache, forwards records to the next processor, or
//! sends them to a topic.

use crate::cache::StoreState;
use crate::record::Record;
use crate::store::{Entries, StoreError, TaskDb};
use crate::window::{KeySchema, Window};

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
    #[error("cannot send to {topic}[{partition}]: {cause}")]
    Send {
        topic: String,
        partition: i32,
        cause: rdkafka::error::KafkaError,
    },
    /// Under at-least-once with the operator, the worker's lease on its tasks lapsed: it
    /// stops writing and retries from its last commit once the API server answers again.
    #[error(transparent)]
    Lease(#[from] crate::status::LeaseLapsed),
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

    /// When [`Self::punctuate`] runs, if ever (Kafka Streams' `ProcessorContext#schedule`).
    fn schedule(&self) -> Option<Punctuation> {
        None
    }

    /// Periodic work, such as summaries or clean-up, as [`Self::schedule`] says: `time` is
    /// the stream time or wall-clock time (ms since the epoch) it runs for. It reads and
    /// writes stores, forwards records to the next processor and sends to topics as
    /// [`Self::process`] does, within the task's transaction under exactly-once.
    fn punctuate(&mut self, time: i64, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        let _ = (time, ctx);
        Ok(())
    }
}

/// When a processor's `punctuate` runs (Kafka Streams' `PunctuationType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Punctuation {
    /// As the task's stream time (the largest timestamp of the input records it processed)
    /// advances: at the first record, then each time it passes another interval. A jump of
    /// several intervals runs it once; no input, no punctuation.
    StreamTime(std::time::Duration),
    /// Every interval of wall-clock time while the task runs, input or not.
    WallClock(std::time::Duration),
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

    /// Whether the topics this sink writes take a record with this timestamp (epoch ms); a
    /// reason if not.
    fn check_timestamp(&self, _timestamp: i64) -> Result<(), String> {
        Ok(())
    }
}

/// What a processor can do while it handles one record.
pub struct Context<'a> {
    pub(crate) stores: &'a mut [StoreState],
    pub(crate) db: Option<&'a TaskDb>,
    /// The app's global tables, if it has any.
    pub(crate) global: Option<&'a crate::global::GlobalStores>,
    pub(crate) sink: &'a mut dyn Sink,
    pub(crate) out: &'a mut Vec<Record>,
    /// The topic of the input the record being processed was read from.
    pub(crate) topic: Option<&'a str>,
}

impl<'a> Context<'a> {
    /// The topic the record being processed was read from (Kafka Streams'
    /// `RecordContext#topic`): which input of the task it entered by. None in a punctuation
    /// and for what a store forwards when its cache flushes.
    pub fn topic(&self) -> Option<&str> {
        self.topic
    }

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

    /// Whether every topic the task writes takes a record with this timestamp: a reason if
    /// one would refuse it (Kafka checks a record's time against its clock).
    pub fn check_timestamp(&self, timestamp: i64) -> Result<(), String> {
        self.sink.check_timestamp(timestamp)
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

    /// The value of `key` in a global table's store (`spec.tables.<name>` with `global:
    /// true`): every key, whatever the task's partition.
    pub fn global(&self, store: &str, key: &[u8]) -> Result<Option<Vec<u8>>, ProcessError> {
        match self.global {
            Some(g) => Ok(g.get(store, key)?),
            None => Err(StoreError::Unknown(store.to_string()).into()),
        }
    }

    /// The task's shard of a window store (declared with [`crate::topology::StoreDef::window`]).
    pub fn window_store(&mut self, name: &str) -> Result<WindowStore<'_>, ProcessError> {
        let inner = self.store(name)?;
        match inner.state.segments.map(|s| s.schema) {
            Some(KeySchema::Window { size }) => Ok(WindowStore { inner, size }),
            _ => Err(not_a(name, "window")),
        }
    }

    /// The task's shard of a session store (declared with [`crate::topology::StoreDef::session`]).
    pub fn session_store(&mut self, name: &str) -> Result<SessionStore<'_>, ProcessError> {
        let inner = self.store(name)?;
        match inner.state.segments.map(|s| s.schema) {
            Some(KeySchema::Session) => Ok(SessionStore { inner }),
            _ => Err(not_a(name, "session")),
        }
    }
}

fn not_a(name: &str, kind: &str) -> ProcessError {
    ProcessError::Fatal(format!(
        "store {name:?} is not a {kind} store: declare it with StoreDef::{kind}"
    ))
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

    /// Every key in `[from, to)` was just deleted: the store may drop the range at once (see
    /// [`StoreState::cleared_range`]).
    pub(crate) fn cleared_range(&mut self, from: &[u8], to: &[u8]) {
        self.state.cleared_range(from, to);
    }

    /// The entries with keys in `[from, to)`, in key order. The store must be declared
    /// `ordered` (see [`crate::topology::StoreDef`]), or entries still in the record cache
    /// are missed.
    pub fn range(&mut self, from: &[u8], to: &[u8]) -> Result<Entries, ProcessError> {
        Ok(self.state.range(self.db, from, to)?)
    }

    /// In a window or session store: the entries of `inner`'s windows whose time (a window's
    /// start, a session's end) is in `[from, to]`, with their store keys, in key order.
    pub(crate) fn fetch(
        &mut self,
        inner: &[u8],
        from: i64,
        to: i64,
    ) -> Result<Entries, ProcessError> {
        Ok(self.state.fetch(self.db, inner, from, to)?)
    }

    /// A window store's window starting at `start` was written: expiry counts the store's
    /// retention back from the latest such start.
    pub fn observe_window(&mut self, start: i64) {
        self.state.observe(start);
    }
}

/// A window store as a processor sees it (Kafka Streams' `WindowStore`): values per key and
/// window start, kept for the store's retention after their start, and fetched by time range.
pub struct WindowStore<'a> {
    inner: KeyValueStore<'a>,
    size: i64,
}

impl WindowStore<'_> {
    fn key(&self, key: &[u8], start: i64) -> Vec<u8> {
        crate::window::key(key, start)
    }

    /// The value of `key`'s window starting at `start`.
    pub fn get(&mut self, key: &[u8], start: i64) -> Result<Option<Vec<u8>>, ProcessError> {
        let k = self.key(key, start);
        self.inner.get(&k)
    }

    pub fn put(&mut self, key: &[u8], start: i64, value: &[u8], timestamp: i64) {
        let k = self.key(key, start);
        self.inner.put(&k, value, timestamp);
        self.inner.observe_window(start);
    }

    pub fn remove(&mut self, key: &[u8], start: i64, timestamp: i64) {
        let k = self.key(key, start);
        self.inner.delete(&k, timestamp);
    }

    /// `key`'s windows starting in `[from, to]`, earliest first.
    pub fn fetch(
        &mut self,
        key: &[u8],
        from: i64,
        to: i64,
    ) -> Result<Vec<(Window, Vec<u8>)>, ProcessError> {
        let schema = KeySchema::Window { size: self.size };
        Ok(self
            .inner
            .fetch(key, from, to)?
            .into_iter()
            .filter_map(|(k, v)| schema.split(&k).map(|(_, w)| (w, v)))
            .collect())
    }

    /// Every key's windows starting in `[from, to]`: (key, window, value), by time then key.
    pub fn fetch_all(&mut self, from: i64, to: i64) -> Result<Vec<WindowEntry>, ProcessError> {
        let schema = KeySchema::Window { size: self.size };
        Ok(self
            .inner
            .state
            .fetch_all(self.inner.db, from, to)?
            .into_iter()
            .filter_map(|(k, v)| schema.split(&k).map(|(inner, w)| (inner.to_vec(), w, v)))
            .collect())
    }
}

/// A key, its window and its value.
pub type WindowEntry = (Vec<u8>, Window, Vec<u8>);

/// A session store as a processor sees it (Kafka Streams' `SessionStore`): values per key and
/// session (`start` and `end`, both included), kept for the store's retention after the
/// session's end.
pub struct SessionStore<'a> {
    inner: KeyValueStore<'a>,
}

impl SessionStore<'_> {
    /// The value of `key`'s session `[start, end]`.
    pub fn fetch_session(
        &mut self,
        key: &[u8],
        start: i64,
        end: i64,
    ) -> Result<Option<Vec<u8>>, ProcessError> {
        let k = KeySchema::Session.key(key, Window { start, end });
        self.inner.get(&k)
    }

    pub fn put(&mut self, key: &[u8], session: Window, value: &[u8], timestamp: i64) {
        self.inner
            .put(&KeySchema::Session.key(key, session), value, timestamp);
        self.inner.observe_window(session.end);
    }

    pub fn remove(&mut self, key: &[u8], session: Window, timestamp: i64) {
        self.inner
            .delete(&KeySchema::Session.key(key, session), timestamp);
    }

    /// `key`'s sessions that end at `earliest_end` or later and start at `latest_start` or
    /// earlier (Kafka Streams' `findSessions`), by end then start.
    pub fn find_sessions(
        &mut self,
        key: &[u8],
        earliest_end: i64,
        latest_start: i64,
    ) -> Result<Vec<(Window, Vec<u8>)>, ProcessError> {
        Ok(self
            .inner
            .fetch(key, earliest_end, i64::MAX)?
            .into_iter()
            .filter_map(|(k, v)| KeySchema::Session.split(&k).map(|(_, w)| (w, v)))
            .filter(|(w, _)| w.start <= latest_start)
            .collect())
    }

    /// All of `key`'s sessions.
    pub fn fetch(&mut self, key: &[u8]) -> Result<Vec<(Window, Vec<u8>)>, ProcessError> {
        self.find_sessions(key, 0, i64::MAX)
    }

    /// Every key's sessions ending in `[from, to]`: (key, session, value), by end then key.
    pub fn fetch_all(&mut self, from: i64, to: i64) -> Result<Vec<WindowEntry>, ProcessError> {
        Ok(self
            .inner
            .state
            .fetch_all(self.inner.db, from, to)?
            .into_iter()
            .filter_map(|(k, v)| {
                KeySchema::Session
                    .split(&k)
                    .map(|(inner, w)| (inner.to_vec(), w, v))
            })
            .collect())
    }
}
