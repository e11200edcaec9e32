//! A stream task: one partition of one sub-topology, with its processors, its shard of each
//! store and the record cache in front of them. The task processes input records, flushes
//! its cache to the changelog, and after the Kafka side of a commit succeeded writes the
//! flushed state to its store together with the changelog offsets reached.

use crate::cache::{Backend, Changes, StoreState};
use crate::collector::{Collector, Slot, dead_letter_headers};
use crate::config::WorkerConfig;
use crate::metrics::{Metrics, OutcomeLabels, StoreLabels, TaskLabels, TaskStateLabel};
use crate::processor::{Context, ProcessError, Processor, Punctuation};
use crate::record::{Data, Origin, Record};
use crate::store::{Change, Mark, MemoryStore, Reconciled, StateResources, StoreError, TaskDb};
use crate::topology::SubTopology;
use crate::window::Segments;
use eddy_crds::{OnError, TaskId, topics};
use prometheus_client::metrics::counter::Counter;
use std::sync::Arc;

pub mod input;
pub use input::{Buffered, Position, TaskInput};

pub use eddy_crds::resource::TaskState;

/// The metric label of a state.
fn state_label(state: TaskState) -> TaskStateLabel {
    match state {
        TaskState::Created | TaskState::Unknown => TaskStateLabel::CREATED,
        TaskState::Restoring => TaskStateLabel::RESTORING,
        TaskState::Running => TaskStateLabel::RUNNING,
        TaskState::Suspended => TaskStateLabel::SUSPENDED,
        TaskState::Closed => TaskStateLabel::CLOSED,
    }
}

/// Why a task stopped the worker.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error(
        "task {task}: record {topic}[{partition}]@{offset}: {reason} (onError: fail stops here; use skip or deadLetter to go on)"
    )]
    BadRecord {
        task: TaskId,
        topic: String,
        partition: i32,
        offset: i64,
        reason: String,
    },
    #[error("task {task}: {cause}")]
    Process { task: TaskId, cause: ProcessError },
    #[error("task {task}: {cause}")]
    Store { task: TaskId, cause: StoreError },
}

pub struct Task {
    pub id: TaskId,
    /// The partition `id.partition` of the source and of each table joined.
    pub inputs: Vec<TaskInput>,
    pub state: TaskState,
    processors: Vec<Box<dyn Processor>>,
    /// Where each processor's output goes ([`SubTopology::next`]).
    next: Vec<Option<usize>>,
    pub(crate) stores: Vec<StoreState>,
    pub(crate) slots: Vec<Slot>,
    pub(crate) db: Option<Arc<TaskDb>>,
    /// Where the task's copy is published for queries while it runs.
    queries: Option<Arc<crate::query::Catalog>>,
    /// The app's global tables, looked up by joins.
    global: Option<Arc<crate::global::GlobalStores>>,
    pub collector: Collector,
    cache_share: usize,
    on_error: OnError,
    dead_letter_topic: String,
    metrics: Arc<Metrics>,
    labels: TaskLabels,
    /// This task's `records_processed` counter, looked up once instead of per record.
    processed: Counter,
    /// The largest timestamp of the input records processed (Kafka Streams' partition time).
    stream_time: Option<i64>,
    /// The event time the entry processor gave the record being processed.
    extracted: Option<i64>,
    /// Processors that asked for punctuation: index, schedule, and when it is next due.
    punctuators: Vec<(usize, Punctuation, Option<i64>)>,
    /// A punctuation ran since the last commit: what it sent must be committed (under
    /// exactly-once its transaction would otherwise stay open while no input comes).
    punctuated: bool,
}

impl Task {
    pub fn new(
        cfg: &WorkerConfig,
        sub: &SubTopology,
        partition: i32,
        resources: &StateResources,
        collector: Collector,
        cache_share: usize,
        metrics: Arc<Metrics>,
    ) -> Result<Task, TaskError> {
        let id = TaskId::new(sub.id, partition);
        let persistent: Vec<String> = sub
            .stores
            .iter()
            .filter(|s| !s.in_memory)
            .map(|s| s.name.clone())
            .collect();
        let dir = cfg.task_dir(id);
        let store_err = |source| TaskError::Store {
            task: id,
            cause: source,
        };
        // The stores on disk follow the topology: families of stores edited out of it (or
        // moved to memory) are dropped, so an edited app starts without anyone deleting volumes.
        let (db, changed) = if persistent.is_empty() {
            let dropped = TaskDb::remove(resources, &dir).map_err(store_err)?;
            if !dropped.is_empty() {
                tracing::info!(task = %id, path = %dir.display(),
                    "no persistent store left in this task: removed its RocksDB directory");
            }
            (
                None,
                Reconciled {
                    dropped,
                    ..Reconciled::default()
                },
            )
        } else {
            let (db, mut changed) =
                TaskDb::open(resources, &dir, &persistent).map_err(store_err)?;
            let (db, relaid) = db.with_segments(&window_segments(sub)).map_err(store_err)?;
            for store in relaid {
                tracing::info!(task = %id, %store,
                    "window store's retention (so its segments) changed, or it was a key-value store: cleared; it restores from its changelog");
                changed.cleared.retain(|s| *s != store);
            }
            (Some(Arc::new(db)), changed)
        };
        for store in &changed.dropped {
            let changelog = topics::changelog(&cfg.application_id, store);
            if sub.stores.iter().any(|s| &s.name == store) {
                tracing::info!(task = %id, %store, %changelog,
                    "store is now in memory: dropped its RocksDB family and checkpoint; it restores from its changelog");
            } else {
                tracing::warn!(task = %id, %store, %changelog,
                    "store is no longer in the topology (removed or renamed): dropped its local state and checkpoint; its changelog topic is left in Kafka (delete it if the store is gone for good)");
            }
        }
        for store in &changed.cleared {
            tracing::warn!(task = %id, %store,
                "store held data without a checkpoint (left by an interrupted drop): cleared; it restores its whole changelog");
        }
        let stores = sub
            .stores
            .iter()
            .map(|d| {
                let backend = if d.in_memory {
                    Backend::Memory(MemoryStore::default())
                } else {
                    Backend::Rocks
                };
                StoreState::for_def(d, topics::changelog(&cfg.application_id, &d.name), backend)
            })
            .collect::<Vec<_>>();
        let slots = stores.iter().map(|_| collector.track()).collect();
        let processed = metrics
            .records_processed
            .get_or_create(&TaskLabels {
                task: id.to_string(),
            })
            .clone();
        let processors: Vec<Box<dyn Processor>> =
            sub.processors.iter().map(|n| (n.supplier)()).collect();
        let punctuators = processors
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.schedule().map(|s| (i, s, None)))
            .collect();
        let task = Task {
            stream_time: None,
            extracted: None,
            punctuators,
            punctuated: false,
            id,
            inputs: sub.inputs.iter().map(TaskInput::new).collect(),
            state: TaskState::Created,
            processors,
            next: sub.processors.iter().map(|n| n.next).collect(),
            stores,
            slots,
            db,
            queries: None,
            global: None,
            collector,
            cache_share,
            on_error: cfg.on_error,
            dead_letter_topic: topics::dead_letter(&cfg.application_id),
            processed,
            labels: TaskLabels {
                task: id.to_string(),
            },
            metrics,
        };
        task.set_state(TaskState::Created);
        Ok(task)
    }

    /// The app's global tables, for the task's joins to look up.
    pub fn with_global(mut self, global: Option<Arc<crate::global::GlobalStores>>) -> Self {
        self.global = global;
        self
    }

    /// Publish the task's stores for queries while it runs.
    pub fn with_queries(mut self, queries: Arc<crate::query::Catalog>) -> Self {
        self.queries = Some(queries);
        self
    }

    /// Drop what window stores hold past their retention, after a commit.
    fn expire_windows(&mut self) -> Result<(), StoreError> {
        for s in &mut self.stores {
            let Some(before) = s.expired_before() else {
                continue;
            };
            match (&self.db, s.is_in_memory()) {
                (_, true) => s.expire_in_memory(before),
                (Some(db), false) => db.expire(&s.name, before)?,
                (None, false) => {}
            }
        }
        Ok(())
    }

    pub fn set_state(&self, state: TaskState) {
        self.metrics
            .set_task_state(&self.labels.task, state_label(state));
    }

    /// Remove this task's gauges: the worker lets the task go.
    pub fn forget_metrics(&self) {
        self.metrics.forget_task(
            &self.labels.task,
            self.stores.iter().map(|s| s.name.as_str()),
        );
    }

    pub fn transition(&mut self, state: TaskState) {
        if state == TaskState::Running {
            // Inputs are waited for from when the task runs, not from before its restore.
            let now = std::time::Instant::now();
            self.inputs.iter_mut().for_each(|i| i.started(now));
        }
        self.state = state;
        self.set_state(state);
        let memory = self.memory_stores();
        if let Some(q) = &self.queries
            && (self.db.is_some() || !memory.is_empty())
        {
            match state {
                TaskState::Running => q.publish(
                    self.id,
                    crate::query::Holder::Active,
                    self.db.as_ref(),
                    memory,
                ),
                _ => q.withdraw(self.id, crate::query::Holder::Active),
            }
        }
    }

    /// Records of several inputs wait in a buffer to be processed in timestamp order.
    pub fn buffers(&self) -> bool {
        self.inputs.len() > 1
    }

    /// Buffer a record of input `input` (see [`Self::process_buffered`]).
    pub fn buffer(&mut self, input: usize, origin: &Origin<'_>, timestamp: i64) {
        if let Some(i) = self.inputs.get_mut(input) {
            i.push(Buffered {
                offset: origin.offset,
                key: origin.key.map(<[u8]>::to_vec),
                value: origin.value.map(<[u8]>::to_vec),
                timestamp,
            });
        }
    }

    /// Process buffered records, the smallest timestamp first, until an empty input may
    /// still have an earlier one ([`input::next_input`]; `position` tells where an input
    /// stands). The number processed.
    pub fn process_buffered(
        &mut self,
        position: impl Fn(&TaskInput) -> Position,
    ) -> Result<usize, TaskError> {
        let mut n = 0;
        let now = std::time::Instant::now();
        while let Some(i) = input::next_input(&self.inputs, now, &position) {
            let Some(r) = self.inputs[i].pop(now) else {
                break;
            };
            let topic = std::mem::take(&mut self.inputs[i].topic);
            let origin = Origin {
                topic: &topic,
                partition: self.id.partition,
                offset: r.offset,
                key: r.key.as_deref(),
                value: r.value.as_deref(),
            };
            let result = self.process(i, &origin, r.timestamp);
            self.inputs[i].topic = topic;
            result?;
            n += 1;
        }
        Ok(n)
    }

    /// The task resumes input `topic` at `offset` (its committed offset).
    pub fn resume_at(&mut self, topic: &str, offset: i64) {
        for i in self.inputs.iter_mut().filter(|i| i.topic == topic) {
            i.fetched = Some(offset);
        }
    }

    /// Records buffered and not processed yet.
    pub fn buffered(&self) -> usize {
        self.inputs.iter().map(TaskInput::buffered).sum()
    }

    /// Process one record of input `input`; bad records follow `onError`.
    pub fn process(
        &mut self,
        input: usize,
        origin: &Origin<'_>,
        timestamp: i64,
    ) -> Result<(), TaskError> {
        let Some(i) = self.inputs.get(input) else {
            return Ok(());
        };
        let (kf, vf, entry, extracts) = (i.key_format, i.value_format, i.entry, i.extracts_time);
        let record = Record::new(
            origin.key.map(|k| Data::raw(k, kf)),
            origin.value.map(|v| Data::raw(v, vf)),
            timestamp,
        );
        self.extracted = None;
        let result = self.run(entry, record, extracts, Some(origin.topic));
        self.handle(result, origin)?;
        if let Some(i) = self.inputs.get_mut(input) {
            i.next_offset = Some(origin.offset + 1);
            i.fetched = i.fetched.max(Some(origin.offset + 1));
        }
        self.processed.inc();
        // A record whose event time could not be extracted moves no time.
        let timestamp = match extracts {
            true => self.extracted,
            false => Some(timestamp),
        };
        if let Some(timestamp) = timestamp
            && self.stream_time.is_none_or(|t| timestamp > t)
        {
            self.stream_time = Some(timestamp);
            self.punctuate(|p| matches!(p, Punctuation::StreamTime(_)), timestamp)?;
        }
        if self
            .stores
            .iter()
            .map(StoreState::dirty_bytes)
            .sum::<usize>()
            > self.cache_share / 2
        {
            self.flush()?;
        }
        Ok(())
    }

    /// Something happened since the last commit: input processed, stores changed, or a
    /// punctuation ran.
    pub fn has_uncommitted(&self) -> bool {
        self.inputs.iter().any(|i| i.next_offset.is_some())
            || self.punctuated
            || self.stores.iter().any(StoreState::has_uncommitted)
    }

    /// Run the wall-clock punctuations due at `now` (ms since the epoch).
    pub fn punctuate_wall_clock(&mut self, now: i64) -> Result<(), TaskError> {
        self.punctuate(|p| matches!(p, Punctuation::WallClock(_)), now)
    }

    /// Run the punctuators of a kind that are due at `time`: the first time at once, then
    /// every interval; a jump over several intervals runs them once.
    fn punctuate(
        &mut self,
        kind: impl Fn(&Punctuation) -> bool,
        time: i64,
    ) -> Result<(), TaskError> {
        for n in 0..self.punctuators.len() {
            let (i, schedule, next) = self.punctuators[n];
            if !kind(&schedule) || next.is_some_and(|t| time < t) {
                continue;
            }
            let interval = match schedule {
                Punctuation::StreamTime(d) | Punctuation::WallClock(d) => {
                    (d.as_millis() as i64).max(1)
                }
            };
            let due = next.unwrap_or(time);
            let skipped = time.saturating_sub(due) / interval;
            let next_due = skipped.saturating_add(1).saturating_mul(interval);
            self.punctuators[n].2 = Some(due.saturating_add(next_due));
            let mut out = Vec::new();
            let mut ctx = Context {
                stores: &mut self.stores,
                db: self.db.as_deref(),
                global: self.global.as_deref(),
                sink: &mut self.collector,
                out: &mut out,
                topic: None,
            };
            self.punctuated = true;
            let mut result = self.processors[i].punctuate(time, &mut ctx);
            for r in out {
                if result.is_err() {
                    break;
                }
                result = self.run(self.next[i], r, false, None);
            }
            result.map_err(|source| TaskError::Process {
                task: self.id,
                cause: source,
            })?;
        }
        Ok(())
    }

    /// Bytes the task's record caches hold.
    pub fn cache_bytes(&self) -> usize {
        self.stores.iter().map(StoreState::bytes).sum()
    }

    /// Flushed-but-uncommitted state is held in memory until the commit writes it to the
    /// store: past the cache share commit early, so the cache stays within its budget. (Dirty
    /// entries flush at half the share; clean copies keep at most the other half.) At least
    /// 1 MiB, so a disabled or tiny cache does not commit per record.
    pub fn wants_commit(&self) -> bool {
        self.cache_bytes() > self.cache_share.max(1 << 20)
    }

    /// Pass a record through the processors from `start` on, along `next`; `extracts`: the
    /// first one sets the event time (kept in `extracted`); `topic`: the input topic it was
    /// read from (none for what punctuation or a cache flush forwards).
    fn run(
        &mut self,
        start: Option<usize>,
        record: Record,
        extracts: bool,
        topic: Option<&str>,
    ) -> Result<(), ProcessError> {
        let mut cur = vec![record];
        let mut at = start;
        let mut first = extracts;
        while let Some(i) = at {
            let Some(p) = self.processors.get_mut(i) else {
                break;
            };
            let mut next = Vec::new();
            for r in cur.drain(..) {
                let mut ctx = Context {
                    stores: &mut self.stores,
                    db: self.db.as_deref(),
                    global: self.global.as_deref(),
                    sink: &mut self.collector,
                    out: &mut next,
                    topic,
                };
                p.process(r, &mut ctx)?;
            }
            if std::mem::take(&mut first) {
                self.extracted = next.iter().map(|r| r.timestamp).max();
            }
            if next.is_empty() {
                return Ok(());
            }
            cur = next;
            at = self.next[i];
        }
        Ok(())
    }

    fn handle(
        &mut self,
        result: Result<(), ProcessError>,
        origin: &Origin<'_>,
    ) -> Result<(), TaskError> {
        let reason = match result {
            Ok(()) => return Ok(()),
            Err(ProcessError::BadRecord(reason)) => reason,
            Err(ProcessError::Skip(reason)) => {
                tracing::debug!(task = %self.id, topic = origin.topic, partition = origin.partition, offset = origin.offset, %reason, "record dropped");
                self.count_outcome("dropped");
                return Ok(());
            }
            Err(source) => {
                return Err(TaskError::Process {
                    task: self.id,
                    cause: source,
                });
            }
        };
        match self.on_error {
            OnError::Fail => Err(TaskError::BadRecord {
                task: self.id,
                topic: origin.topic.to_string(),
                partition: origin.partition,
                offset: origin.offset,
                reason,
            }),
            OnError::Skip => {
                tracing::warn!(task = %self.id, topic = origin.topic, partition = origin.partition, offset = origin.offset, %reason, "record skipped");
                self.count_outcome("skip");
                Ok(())
            }
            OnError::DeadLetter => {
                let headers =
                    dead_letter_headers(&reason, origin.topic, origin.partition, origin.offset);
                self.collector
                    .send_raw(
                        &self.dead_letter_topic,
                        0,
                        origin.key,
                        origin.value,
                        -1,
                        Some(headers),
                        None,
                    )
                    .map_err(|source| TaskError::Process {
                        task: self.id,
                        cause: source,
                    })?;
                tracing::warn!(task = %self.id, topic = origin.topic, partition = origin.partition, offset = origin.offset, %reason, "record dead-lettered");
                self.count_outcome("dead_letter");
                Ok(())
            }
        }
    }

    fn count_outcome(&self, outcome: &str) {
        self.metrics
            .bad_records
            .get_or_create(&OutcomeLabels {
                task: self.labels.task.clone(),
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// Send dirty cache entries to the changelog and forward them downstream. Stores fed by
    /// an earlier store's updates come later in the list, so one pass in order is enough;
    /// the loop guards against custom topologies that feed backwards.
    pub fn flush(&mut self) -> Result<(), TaskError> {
        while self.stores.iter().any(StoreState::has_dirty) {
            for i in 0..self.stores.len() {
                let dirty = self.stores[i].take_dirty();
                let fwd = self.stores[i].forward_to;
                for d in dirty {
                    let s = &self.stores[i];
                    self.collector
                        .send_raw(
                            &s.changelog,
                            self.id.partition,
                            Some(&d.key),
                            d.value.as_deref(),
                            d.timestamp,
                            None,
                            Some(&self.slots[i]),
                        )
                        .map_err(|source| TaskError::Process {
                            task: self.id,
                            cause: source,
                        })?;
                    if let Some(f) = fwd {
                        let name = self.stores[i].name.clone();
                        let origin = Origin {
                            topic: &name,
                            partition: self.id.partition,
                            offset: -1,
                            key: Some(&d.key),
                            value: d.value.as_deref(),
                        };
                        let record = self.stores[i].downstream(&d);
                        let result = self.run(Some(f), record, false, None);
                        self.handle(result, &origin)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// After the Kafka side of the commit succeeded: write what was flushed to the store, in
    /// one batch with the changelog offsets reached, so the store only ever holds committed
    /// state and knows exactly where its changelog tail starts.
    pub fn write_committed(&mut self) -> Result<(), TaskError> {
        let mut batch: Vec<(String, Changes, Mark)> = Vec::new();
        let mut cleared: Vec<(String, Vec<u8>, Vec<u8>)> = Vec::new();
        let keep = self.cache_share / 2 / self.stores.len().max(1);
        let now = crate::record::now_ms();
        for (s, slot) in self.stores.iter_mut().zip(&self.slots) {
            let changes = s.take_committed(keep);
            // The task is its changelogs' only writer: at each commit every store of it is at
            // its changelog's end, whether it wrote anything or not.
            let checkpoint = Mark {
                offset: Some(slot.delivered()).filter(|o| *o >= 0),
                caught_up_at: Some(now),
            };
            if s.is_in_memory() {
                s.apply_in_memory(&changes, checkpoint);
            } else {
                cleared.extend(
                    s.take_cleared()
                        .into_iter()
                        .map(|(from, to)| (s.name.clone(), from, to)),
                );
                // In key order: RocksDB's memtable then finds each key's place from the
                // previous one's instead of from the top of its skiplist (inserting in the
                // cache's order took 12 % of the processing thread's time at 1M keys).
                let mut changes = changes;
                changes.sort_unstable_by(|a, b| a.0.cmp(&b.0));
                // A key flushed twice since the last commit is listed twice, with one value.
                changes.dedup_by(|a, b| a.0 == b.0);
                batch.push((s.name.clone(), changes, checkpoint));
            }
            let hits = std::mem::take(&mut s.hits);
            let misses = std::mem::take(&mut s.misses);
            let l = StoreLabels {
                task: self.labels.task.clone(),
                store: s.name.clone(),
            };
            self.metrics.cache_hits.get_or_create(&l).inc_by(hits);
            self.metrics.cache_misses.get_or_create(&l).inc_by(misses);
        }
        if let Some(db) = &self.db {
            let changes = batch.iter().flat_map(|(store, changes, _)| {
                changes.iter().map(move |(k, v)| {
                    (
                        store.as_str(),
                        Change {
                            key: k,
                            value: v.as_deref(),
                        },
                    )
                })
            });
            let checkpoints = batch.iter().map(|(store, _, c)| (store.as_str(), *c));
            let cleared = cleared
                .iter()
                .map(|(store, from, to)| (store.as_str(), &from[..], &to[..]));
            db.write_clearing(cleared, changes, checkpoints)
                .map_err(|source| TaskError::Store {
                    task: self.id,
                    cause: source,
                })?;
            for (store, _, _) in &batch {
                let (keys, bytes) = db.size(store);
                let l = StoreLabels {
                    task: self.labels.task.clone(),
                    store: store.clone(),
                };
                self.metrics.store_keys.get_or_create(&l).set(keys as i64);
                self.metrics.store_bytes.get_or_create(&l).set(bytes as i64);
            }
        }
        self.expire_windows().map_err(|source| TaskError::Store {
            task: self.id,
            cause: source,
        })?;
        for i in &mut self.inputs {
            i.next_offset = None;
        }
        self.punctuated = false;
        Ok(())
    }

    /// Flush the store to disk and mark the task closed (clean shutdown or hand-off).
    pub fn close(&mut self) -> Result<(), TaskError> {
        self.mark_caught_up()?;
        if let Some(db) = &self.db {
            db.flush().map_err(|source| TaskError::Store {
                task: self.id,
                cause: source,
            })?;
        }
        self.transition(TaskState::Closed);
        Ok(())
    }

    /// A running task with nothing uncommitted is at its changelogs' ends, however long since
    /// its last commit (a task without input commits nothing): its checkpoints say so now, so
    /// that a restore after a crash does not take them for too old to trust
    /// ([`crate::checkpoint`]).
    pub fn mark_caught_up(&mut self) -> Result<(), TaskError> {
        if self.state == TaskState::Running && !self.has_uncommitted() {
            let mark = Mark {
                offset: None,
                caught_up_at: Some(crate::record::now_ms()),
            };
            for s in &mut self.stores {
                s.apply_in_memory(&Changes::new(), mark);
            }
            if let Some(db) = &self.db {
                let persistent = self.stores.iter().filter(|s| !s.is_in_memory());
                db.write(
                    std::iter::empty(),
                    persistent.map(|s| (s.name.as_str(), mark)),
                )
                .map_err(|source| TaskError::Store {
                    task: self.id,
                    cause: source,
                })?;
            }
        }
        Ok(())
    }

    /// Drop the task without committing (Kafka Streams' "close dirty"): its cache and
    /// anything flushed since the last commit are thrown away; its store keeps the last
    /// commit, and restore brings it up to the changelog's committed end next time.
    pub fn close_dirty(mut self) {
        self.transition(TaskState::Closed);
        tracing::info!(task = %self.id, "task closed without committing");
    }

    /// The in-memory stores (shared handles), by name.
    fn memory_stores(&self) -> Vec<(String, MemoryStore)> {
        self.stores
            .iter()
            .filter_map(|s| match &s.backend {
                Backend::Memory(m) => Some((s.name.clone(), m.clone())),
                Backend::Rocks => None,
            })
            .collect()
    }

    /// Take the in-memory stores' committed state (a demoted task's, for its standby).
    pub fn take_memory_stores(&mut self) -> Vec<(String, MemoryStore)> {
        self.stores
            .iter_mut()
            .filter_map(|s| match &mut s.backend {
                Backend::Memory(m) => Some((s.name.clone(), std::mem::take(m))),
                Backend::Rocks => None,
            })
            .collect()
    }

    /// Start the in-memory stores from a standby's copy (a promoted task's): restore then
    /// replays only what the copy lacks.
    pub fn give_memory_stores(&mut self, memory: Vec<(String, MemoryStore)>) {
        for (name, m) in memory {
            if let Some(s) = self.stores.iter_mut().find(|s| s.name == name)
                && s.is_in_memory()
            {
                s.backend = Backend::Memory(m);
            }
        }
    }

    pub fn db(&self) -> Option<&TaskDb> {
        self.db.as_deref()
    }

    pub fn stores(&self) -> &[StoreState] {
        &self.stores
    }
}

impl Drop for Task {
    /// However the task goes (closed, closed dirty, dropped by an error), queries stop
    /// reading its database before it closes.
    fn drop(&mut self) {
        if let Some(q) = &self.queries {
            q.withdraw(self.id, crate::query::Holder::Active);
        }
    }
}

/// The window stores of a sub-topology that live in RocksDB, with their segments.
pub fn window_segments(sub: &SubTopology) -> Vec<(String, Segments)> {
    sub.stores
        .iter()
        .filter(|s| !s.in_memory)
        .filter_map(|s| s.window.map(|w| (s.name.clone(), w.segments())))
        .collect()
}
