//! The state updater (Kafka Streams' StateUpdater) for standby and warm-up tasks: its own
//! thread and ONE long-lived changelog consumer (`read_committed`, manual assignment, no
//! group commits) keep each replica's stores up to date while the processing thread
//! processes. Records are batched per store (last value per key, as restore does) and
//! written with the store's checkpoint in one atomic RocksDB batch, so a restarted worker
//! resumes a standby from its checkpoint, and a promoted task restores only the tail.
//!
//! In-memory stores are followed too (kept in memory here) and handed to the processing
//! thread on promotion, or taken from it on demotion.
//!
//! The processing thread talks to it through [`Updater::set`]: "follow exactly these
//! replicas"; when it returns, every task not in the set has its database closed (so the
//! processing thread can open it) and its in-memory stores handed back.
//!
//! Lag per store is the changelog's end minus the position the store's checkpoint holds. The
//! end is the last stable offset librdkafka's statistics report every second (no request of
//! its own), or the end seen when the replica opened, or past the last record read. An end no
//! fetch response confirmed for [`crate::ends::FRESH_FOR`] makes the lag unknown (None), not a
//! number that stopped moving: queries bounded by `maxLag` and the operator's "caught up" then
//! do not trust the copy.
//!
//! Each checkpoint written carries when the store was last at its changelog's end (see
//! [`crate::checkpoint`]): the time a fetch confirmed the end it reached, refreshed while it
//! stays there. A store that falls behind for longer than its changelog keeps tombstones is
//! opened again, which checks it like a restore does.

use crate::cache::Changes;
use crate::checkpoint;
use crate::config::WorkerConfig;
use crate::ends::{self, Ends};
use crate::metrics::{Metrics, RoleLabels, StoreLabels};
use crate::plan;
use crate::query::Holder;
use crate::restore::{BATCH_BYTES, Pending};
use crate::status::Status;
use crate::store::{Change, Checkpoint, Mark, MemoryStore, StateResources, StoreError, TaskDb};
use eddy_crds::TaskId;
use eddy_crds::resource::{TaskRole, TaskState, TaskStatus};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::statistics::Statistics;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// In-memory stores of one task, by store name, handed between the updater and the
/// processing thread.
pub type MemoryStores = HashMap<TaskId, Vec<(String, MemoryStore)>>;

#[derive(Debug, thiserror::Error)]
pub enum UpdaterError {
    #[error("the state updater thread is gone")]
    Gone,
    #[error("starting the state updater thread: {0}")]
    Spawn(std::io::Error),
}

enum Command {
    Set {
        replicas: Vec<(TaskId, TaskRole)>,
        given: MemoryStores,
        reply: Sender<MemoryStores>,
    },
    Stop,
}

/// The processing thread's handle on the state updater thread.
pub struct Updater {
    tx: Sender<Command>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The replicas the updater follows (as last set).
    pub replicas: Vec<(TaskId, TaskRole)>,
}

impl Updater {
    pub fn start(
        cfg: &WorkerConfig,
        resources: Arc<StateResources>,
        metrics: Arc<Metrics>,
        status: Arc<Status>,
    ) -> Result<Self, UpdaterError> {
        let (tx, rx) = mpsc::channel();
        let cfg = cfg.clone();
        let thread = std::thread::Builder::new()
            .name("eddy-standby".into())
            .spawn(move || {
                State {
                    cfg,
                    resources,
                    metrics,
                    status,
                    ends: Arc::new(Mutex::new(Ends::default())),
                    consumer: None,
                    replicas: Vec::new(),
                    reopen: Vec::new(),
                    last_error: None,
                }
                .run(rx)
            })
            .map_err(UpdaterError::Spawn)?;
        Ok(Self {
            tx,
            thread: Some(thread),
            replicas: Vec::new(),
        })
    }

    /// Follow exactly `replicas` (with `given`: in-memory stores of tasks demoted here). On
    /// return every other task's database is closed; the in-memory stores of the tasks let
    /// go are returned. New replicas are opened after the return, so a promotion does not
    /// wait for them. `beat` is called while waiting.
    pub fn set(
        &mut self,
        replicas: &[(TaskId, TaskRole)],
        given: MemoryStores,
        beat: impl Fn(),
    ) -> Result<MemoryStores, UpdaterError> {
        let (reply, answer) = mpsc::channel();
        self.tx
            .send(Command::Set {
                replicas: replicas.to_vec(),
                given,
                reply,
            })
            .map_err(|_| UpdaterError::Gone)?;
        loop {
            beat();
            match answer.recv_timeout(Duration::from_millis(200)) {
                Ok(handed) => {
                    self.replicas = replicas.to_vec();
                    return Ok(handed);
                }
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return Err(UpdaterError::Gone),
            }
        }
    }

    /// Let go of every replica (checkpoints written, databases closed) and end the thread.
    pub fn stop(&mut self) {
        let _ = self.tx.send(Command::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Updater {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Changelog ends (last stable offsets) from librdkafka's statistics.
type SharedEnds = Arc<Mutex<Ends>>;

struct UpdaterContext(SharedEnds);

impl ClientContext for UpdaterContext {
    fn stats(&self, stats: Statistics) {
        let Ok(mut ends) = self.0.lock() else { return };
        ends.observe_stats(&stats, Instant::now());
    }
}
impl ConsumerContext for UpdaterContext {}

/// One store of a replica.
struct ReplicaStore {
    name: String,
    changelog: String,
    /// Some for an in-memory store.
    memory: Option<MemoryStore>,
    /// Next changelog offset the stored state lacks (its checkpoint).
    position: i64,
    /// The changelog's end as last known.
    end: Option<i64>,
    /// When the end was last confirmed by the broker (see [`ends::fresh`]).
    end_at: Option<Instant>,
    /// When the store was last at its changelog's end, as its checkpoint says (ms since the
    /// epoch).
    caught_up_at: Option<i64>,
    /// The time written with batches until the store first reaches the end: when its read
    /// from the changelog's beginning started (None: it started from a checkpoint, whose
    /// time stays).
    meanwhile: Option<i64>,
    /// The changelog's `delete.retention.ms`, if it is compacted.
    tombstones: Option<i64>,
    pending: Pending,
    /// A record arrived since the changelog was assigned: only then does the consumer's
    /// position speak for this assignment.
    fresh: bool,
    labels: StoreLabels,
}

/// A standby or warm-up task.
struct Replica {
    id: TaskId,
    role: TaskRole,
    db: Option<Arc<TaskDb>>,
    stores: Vec<ReplicaStore>,
    /// Reached the changelogs' end at least once (RESTORING before, RUNNING after).
    caught_up: bool,
    /// Offered to queries (once caught up: a copy still restoring would answer from a
    /// fraction of the state).
    queryable: bool,
}

impl ReplicaStore {
    /// Records the store lacks; None while its changelog's end is not known to be current.
    fn lag(&self, now: Instant) -> Option<i64> {
        plan::lag(self.position, ends::fresh(self.end, self.end_at, now))
    }
}

impl Replica {
    fn lag(&self, now: Instant) -> Option<i64> {
        self.stores.iter().map(|s| s.lag(now)).sum()
    }

    fn report(&self, now: Instant) -> TaskStatus {
        TaskStatus {
            role: self.role,
            state: if self.caught_up {
                TaskState::Running
            } else {
                TaskState::Restoring
            },
            restore_backlog: 0,
            lag: self.lag(now),
        }
    }
}

struct State {
    cfg: WorkerConfig,
    resources: Arc<StateResources>,
    metrics: Arc<Metrics>,
    status: Arc<Status>,
    ends: SharedEnds,
    /// Created with the first replica, kept for the life of the thread.
    consumer: Option<BaseConsumer<UpdaterContext>>,
    replicas: Vec<Replica>,
    /// Replicas that failed to open or to write, opened again after a pause.
    reopen: Vec<(TaskId, TaskRole, Instant)>,
    last_error: Option<Instant>,
}

impl Drop for State {
    /// However the thread ends (stopped, or a panic), queries stop reading its replicas: a
    /// copy of in-memory stores left listed would answer from state nobody follows any more.
    fn drop(&mut self) {
        for r in &self.replicas {
            self.status.queries.withdraw(r.id, Holder::Replica);
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum ReplicaError {
    #[error("standby task {task}: {cause}")]
    Store { task: TaskId, cause: StoreError },
    #[error("standby task {task}: reading {topic}: {cause}")]
    Kafka {
        task: TaskId,
        topic: String,
        cause: KafkaError,
    },
}

/// How often pending records are written and the report refreshed while tailing.
const APPLY_EVERY: Duration = Duration::from_millis(100);
/// Pause before opening a replica again after it failed.
const REOPEN_AFTER: Duration = Duration::from_secs(5);
/// How often a store that stays at its changelog's end writes that it still is: a restart
/// then finds its checkpoint recent, though nothing moved it.
const CAUGHT_UP_EVERY_MS: i64 = 60_000;

impl State {
    fn run(mut self, rx: Receiver<Command>) {
        let mut next_apply = Instant::now() + APPLY_EVERY;
        loop {
            let wait = if self.replicas.is_empty() {
                Duration::from_millis(200)
            } else {
                Duration::ZERO
            };
            match rx.recv_timeout(wait) {
                Ok(Command::Set {
                    replicas,
                    given,
                    reply,
                }) => {
                    let handed = self.release(&replicas);
                    self.publish();
                    // The processing thread takes promoted tasks only after this answer:
                    // answer before opening new replicas, each of which asks the brokers
                    // for its changelogs' ends (up to a fetch wait each).
                    let _ = reply.send(handed);
                    self.open_missing(&replicas, given);
                    self.publish();
                    continue;
                }
                Ok(Command::Stop) | Err(RecvTimeoutError::Disconnected) => {
                    self.set(&[], MemoryStores::new());
                    self.publish();
                    return;
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
            self.retry_opens();
            if self.replicas.is_empty() {
                continue;
            }
            self.poll();
            if Instant::now() >= next_apply {
                self.apply_all();
                self.offer_to_queries();
                self.publish();
                next_apply = Instant::now() + APPLY_EVERY;
            }
        }
    }

    fn consumer(&mut self) -> Result<&BaseConsumer<UpdaterContext>, KafkaError> {
        if self.consumer.is_none() {
            let c = self
                .cfg
                .client_config_with(&[
                    ("fetch.max.bytes", "52428800"),
                    ("max.partition.fetch.bytes", "10485760"),
                    ("queued.max.messages.kbytes", "65536"),
                    ("fetch.queue.backoff.ms", "10"),
                    ("statistics.interval.ms", "1000"),
                ])
                .set("group.id", format!("{}-standby", self.cfg.application_id))
                .set("enable.auto.commit", "false")
                .set("enable.auto.offset.store", "false")
                .set("isolation.level", "read_committed")
                // A position the changelog no longer has is an error here, not a silent
                // jump: the store is checked against its changelog again (see `open`).
                .set("auto.offset.reset", "error")
                .create_with_context(UpdaterContext(self.ends.clone()))?;
            self.consumer = Some(c);
        }
        self.consumer.as_ref().ok_or(KafkaError::NoMessageReceived)
    }

    /// Follow exactly `wanted`: close the others (handing back their in-memory stores), open
    /// the new ones, update roles.
    fn set(&mut self, wanted: &[(TaskId, TaskRole)], given: MemoryStores) -> MemoryStores {
        let handed = self.release(wanted);
        self.open_missing(wanted, given);
        handed
    }

    /// Close the replicas not in `wanted` (handing back their in-memory stores) and update
    /// the roles of those that stay.
    fn release(&mut self, wanted: &[(TaskId, TaskRole)]) -> MemoryStores {
        let mut handed = MemoryStores::new();
        self.reopen
            .retain(|(id, _, _)| wanted.iter().any(|(w, _)| w == id));
        let (keep, gone): (Vec<Replica>, Vec<Replica>) = std::mem::take(&mut self.replicas)
            .into_iter()
            .partition(|r| wanted.iter().any(|(w, _)| *w == r.id));
        self.replicas = keep;
        for r in gone {
            let id = r.id;
            let memory = self.close(r);
            if !memory.is_empty() {
                handed.insert(id, memory);
            }
        }
        for (id, role) in wanted {
            if let Some(r) = self.replicas.iter_mut().find(|r| r.id == *id) {
                r.role = *role;
            }
        }
        self.count_roles();
        handed
    }

    /// Open the replicas of `wanted` not followed yet (with `given`: in-memory stores of
    /// tasks demoted here).
    fn open_missing(&mut self, wanted: &[(TaskId, TaskRole)], mut given: MemoryStores) {
        let missing: Vec<(TaskId, TaskRole)> = wanted
            .iter()
            .filter(|(id, _)| {
                !self.replicas.iter().any(|r| r.id == *id)
                    && !self.reopen.iter().any(|(t, _, _)| t == id)
            })
            .copied()
            .collect();
        if missing.is_empty() {
            return;
        }
        let retention = self.retention();
        for (id, role) in &missing {
            let memory = given.remove(id).unwrap_or_default();
            if let Err(e) = self.open(*id, *role, memory, &retention) {
                tracing::warn!(error = %e, retry_in = ?REOPEN_AFTER, "could not start following a standby task");
                self.reopen
                    .push((*id, *role, Instant::now() + REOPEN_AFTER));
            }
        }
        self.count_roles();
    }

    fn retry_opens(&mut self) {
        let now = Instant::now();
        let due: Vec<(TaskId, TaskRole)> = self
            .reopen
            .iter()
            .filter(|(_, _, at)| *at <= now)
            .map(|(id, role, _)| (*id, *role))
            .collect();
        if due.is_empty() {
            return;
        }
        self.reopen.retain(|(_, _, at)| *at > now);
        let retention = self.retention();
        for (id, role) in due {
            if let Err(e) = self.open(id, role, Vec::new(), &retention) {
                tracing::warn!(error = %e, retry_in = ?REOPEN_AFTER, "could not start following a standby task");
                self.reopen.push((id, role, Instant::now() + REOPEN_AFTER));
            }
        }
        self.count_roles();
        self.publish();
    }

    /// The tombstone retention of the app's changelogs, read once for the replicas opened
    /// together (a lowered `delete.retention.ms` applies from their next opening).
    fn retention(&self) -> Result<HashMap<String, Option<i64>>, KafkaError> {
        let app = &self.cfg.application_id;
        let names: Vec<String> = self
            .cfg
            .topology
            .subtopologies
            .iter()
            .flat_map(|s| s.stores.iter())
            .map(|d| eddy_crds::topics::changelog(app, &d.name))
            .collect();
        if names.is_empty() {
            return Ok(HashMap::new());
        }
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        crate::changelog::tombstone_retention(&self.cfg, &names)
            .map_err(crate::changelog::TopicError::into_kafka)
    }

    /// Open a replica's stores at their checkpoints and start tailing their changelogs. A
    /// checkpoint its changelog no longer covers, or older than the changelog keeps
    /// tombstones, empties that store (as restore does).
    fn open(
        &mut self,
        id: TaskId,
        role: TaskRole,
        mut memory: Vec<(String, MemoryStore)>,
        retention: &Result<HashMap<String, Option<i64>>, KafkaError>,
    ) -> Result<(), ReplicaError> {
        let retention = retention.as_ref().map_err(|e| ReplicaError::Kafka {
            task: id,
            topic: "the changelogs' configs".into(),
            cause: e.clone(),
        })?;
        let store_err = |source| ReplicaError::Store {
            task: id,
            cause: source,
        };
        let Some(sub) = self
            .cfg
            .topology
            .subtopologies
            .iter()
            .find(|s| s.id == id.subtopology)
        else {
            return Ok(());
        };
        let persistent: Vec<String> = sub
            .stores
            .iter()
            .filter(|s| !s.in_memory)
            .map(|s| s.name.clone())
            .collect();
        let db = if persistent.is_empty() {
            None
        } else {
            let (db, _) = TaskDb::open(&self.resources, &self.cfg.task_dir(id), &persistent)
                .map_err(store_err)?;
            let (db, _) = db
                .with_segments(&crate::task::window_segments(sub))
                .map_err(store_err)?;
            Some(Arc::new(db))
        };
        let defs: Vec<(String, bool)> = sub
            .stores
            .iter()
            .map(|s| (s.name.clone(), s.in_memory))
            .collect();
        let app = self.cfg.application_id.clone();
        self.consumer().map_err(|source| ReplicaError::Kafka {
            task: id,
            topic: String::new(),
            cause: source,
        })?;
        let Some(consumer) = &self.consumer else {
            return Ok(());
        };
        let mut stores = Vec::new();
        let mut tpl = TopicPartitionList::new();
        for (name, in_memory) in defs {
            let changelog = eddy_crds::topics::changelog(&app, &name);
            let kafka = |source| ReplicaError::Kafka {
                task: id,
                topic: changelog.clone(),
                cause: source,
            };
            // Before the end is read: the end reached was the end at this time at the latest.
            let read_at = crate::record::now_ms();
            let (low, high) = consumer
                .fetch_watermarks(&changelog, id.partition, Duration::from_secs(30))
                .map_err(kafka)?;
            let end_at = Instant::now();
            let mut mem = if in_memory {
                Some(
                    memory
                        .iter()
                        .position(|(n, _)| *n == name)
                        .map(|i| memory.swap_remove(i).1)
                        .unwrap_or_default(),
                )
            } else {
                None
            };
            let mut checkpoint: Option<Checkpoint> = match (&mem, &db) {
                (Some(m), _) => m.read().stored_checkpoint(),
                (None, Some(db)) => db.stored_checkpoint(&name).map_err(store_err)?,
                (None, None) => None,
            };
            let labels = StoreLabels {
                task: id.to_string(),
                store: name.clone(),
            };
            let tombstones = retention.get(&changelog).copied().flatten();
            if let Some(c) = checkpoint
                && let Some(why) = checkpoint::check(c, low, high, tombstones, read_at)
            {
                checkpoint::rebuilding(
                    &self.metrics,
                    &why,
                    &labels.task,
                    &name,
                    &changelog,
                    id.partition,
                    "a standby or warm-up copy; the task's other stores are kept",
                );
                match (&mut mem, &db) {
                    (Some(m), _) => m.clear(),
                    (None, Some(db)) => db.clear(&name).map_err(store_err)?,
                    (None, None) => {}
                }
                checkpoint = None;
            }
            let position = checkpoint.map_or(low, |c| c.offset);
            let meanwhile = checkpoint.is_none().then_some(read_at);
            tpl.add_partition_offset(&changelog, id.partition, Offset::Offset(position))
                .map_err(kafka)?;
            stores.push(ReplicaStore {
                name,
                changelog,
                memory: mem,
                position,
                end: Some(high),
                end_at: Some(end_at),
                caught_up_at: checkpoint.and_then(|c| c.caught_up_at).or(meanwhile),
                meanwhile,
                tombstones,
                pending: Pending::default(),
                fresh: false,
                labels,
            });
        }
        if tpl.count() > 0 {
            consumer
                .incremental_assign(&tpl)
                .map_err(|source| ReplicaError::Kafka {
                    task: id,
                    topic: String::new(),
                    cause: source,
                })?;
        }
        let r = Replica {
            id,
            role,
            db,
            stores,
            caught_up: false,
            queryable: false,
        };
        tracing::info!(task = %id, %role, lag = ?r.lag(Instant::now()), "following the task's changelogs");
        self.replicas.push(r);
        Ok(())
    }

    /// Stop tailing a replica: write what was read, close its database (it stays on disk),
    /// return its in-memory stores.
    fn close(&mut self, mut r: Replica) -> Vec<(String, MemoryStore)> {
        self.status.queries.withdraw(r.id, Holder::Replica);
        if let Err(e) = apply(&mut r, &self.metrics, &HashMap::new(), Instant::now()) {
            tracing::warn!(error = %e, "writing a standby's last records before letting it go (they are read again later)");
        }
        let mut tpl = TopicPartitionList::new();
        for s in &r.stores {
            let _ = tpl.add_partition(&s.changelog, r.id.partition);
            self.metrics.standby_lag.remove(&s.labels);
        }
        if let Some(c) = &self.consumer
            && tpl.count() > 0
            && let Err(e) = c.incremental_unassign(&tpl)
        {
            tracing::warn!(task = %r.id, "unassigning a standby's changelogs: {e}");
        }
        if let Some(db) = &r.db
            && let Err(e) = db.flush()
        {
            tracing::warn!(task = %r.id, "flushing a standby's store: {e}");
        }
        tracing::info!(task = %r.id, role = %r.role, "stopped following the task");
        r.stores
            .into_iter()
            .filter_map(|s| s.memory.map(|m| (s.name, m)))
            .collect()
    }

    fn poll(&mut self) {
        let Some(consumer) = &self.consumer else {
            return;
        };
        let started = Instant::now();
        let mut full = false;
        while started.elapsed() < APPLY_EVERY {
            let m = match consumer.poll(Duration::from_millis(50)) {
                None => break,
                Some(Ok(m)) => m,
                Some(Err(e)) => {
                    self.poll_error(e);
                    return;
                }
            };
            let (topic, p) = (m.topic(), m.partition());
            let Some(s) = self
                .replicas
                .iter_mut()
                .filter(|r| r.id.partition == p)
                .flat_map(|r| r.stores.iter_mut())
                .find(|s| s.changelog == topic)
            else {
                continue;
            };
            s.pending
                .add(m.key().unwrap_or_default(), m.payload(), m.offset());
            s.end = Some(s.end.unwrap_or(0).max(m.offset() + 1));
            s.fresh = true;
            if s.pending.bytes >= BATCH_BYTES {
                full = true;
                break;
            }
        }
        if full {
            self.apply_all();
        }
    }

    fn poll_error(&mut self, e: KafkaError) {
        use rdkafka::types::RDKafkaErrorCode::*;
        let code = e.rdkafka_error_code();
        if matches!(code, Some(AutoOffsetReset | OffsetOutOfRange)) {
            // Some changelog lost the records a standby is at: open every replica again,
            // which checks each store against its changelog.
            tracing::warn!(
                "standby changelog position out of range ({e}): checking every standby store against its changelog again"
            );
            let all: Vec<(TaskId, TaskRole)> =
                self.replicas.iter().map(|r| (r.id, r.role)).collect();
            let memory = self.set(&[], MemoryStores::new());
            self.set(&all, memory);
            return;
        }
        let quiet = self
            .last_error
            .is_some_and(|t| t.elapsed() < Duration::from_secs(10));
        if !quiet {
            tracing::warn!("following standby changelogs: {e} (librdkafka retries)");
            self.last_error = Some(Instant::now());
        }
    }

    /// Write every replica's pending records with their checkpoints.
    fn apply_all(&mut self) {
        let positions = self.positions();
        let now = Instant::now();
        let mut failed = Vec::new();
        for (i, r) in self.replicas.iter_mut().enumerate() {
            if let Ok(ends) = self.ends.lock() {
                for s in &mut r.stores {
                    // Records read past it move the end too (`poll`), not its confirmation.
                    if let Some(e) = ends.get(&s.changelog, r.id.partition) {
                        s.end = Some(s.end.unwrap_or(0).max(e.offset));
                        s.end_at = s.end_at.max(e.confirmed);
                    }
                }
            }
            if let Err(e) = apply(r, &self.metrics, &positions, now) {
                tracing::warn!(error = %e, retry_in = ?REOPEN_AFTER, "writing a standby's records failed: opening it again from its checkpoint");
                failed.push(i);
            } else if let Some((store, why)) = behind_tombstones(r) {
                // Opening checks it against the changelog, as a restore would.
                tracing::warn!(task = %r.id, store, reason = why.reason(), retry_in = ?REOPEN_AFTER,
                    "{why}: opening the standby again");
                failed.push(i);
            }
        }
        for i in failed.into_iter().rev() {
            let r = self.replicas.remove(i);
            let (id, role) = (r.id, r.role);
            drop(self.close(r));
            self.reopen.push((id, role, Instant::now() + REOPEN_AFTER));
        }
    }

    /// The consumer's position per (changelog, partition): past control records, which
    /// carry no data but do move a changelog's end.
    fn positions(&self) -> HashMap<(String, i32), i64> {
        let Some(c) = &self.consumer else {
            return HashMap::new();
        };
        let Ok(pos) = c.position() else {
            return HashMap::new();
        };
        pos.elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(o) => Some(((e.topic().to_string(), e.partition()), o)),
                _ => None,
            })
            .collect()
    }

    /// The replicas' entries for this worker's report, and the lag metrics.
    /// Replicas that caught up answer queries from now on (until they close).
    fn offer_to_queries(&mut self) {
        for r in self
            .replicas
            .iter_mut()
            .filter(|r| r.caught_up && !r.queryable)
        {
            let memory: Vec<(String, MemoryStore)> = r
                .stores
                .iter()
                .filter_map(|s| Some((s.name.clone(), s.memory.clone()?)))
                .collect();
            if r.db.is_some() || !memory.is_empty() {
                self.status
                    .queries
                    .publish(r.id, Holder::Replica, r.db.as_ref(), memory);
            }
            r.queryable = true;
        }
    }

    fn publish(&self) {
        let now = Instant::now();
        let report: std::collections::BTreeMap<String, TaskStatus> = self
            .replicas
            .iter()
            .map(|r| (r.id.to_string(), r.report(now)))
            .collect();
        let now = Instant::now();
        for r in &self.replicas {
            publish_lag(&self.metrics, r, now);
        }
        if let Ok(mut m) = self.status.replicas.lock() {
            *m = report;
        }
    }

    fn count_roles(&self) {
        for role in [TaskRole::Standby, TaskRole::Warmup] {
            let n = self.replicas.iter().filter(|r| r.role == role).count()
                + self.reopen.iter().filter(|(_, r, _)| *r == role).count();
            self.metrics
                .standby_tasks
                .get_or_create(&RoleLabels {
                    role: role.name().to_ascii_lowercase(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }
}

/// The lag metric of each store of `r`.
fn publish_lag(metrics: &Metrics, r: &Replica, now: Instant) {
    for s in &r.stores {
        match s.lag(now) {
            Some(l) => {
                metrics.standby_lag.get_or_create(&s.labels).set(l);
            }
            // Not known: no series, rather than the last number.
            None => {
                metrics.standby_lag.remove(&s.labels);
            }
        }
    }
}

/// A store of `r` that is not at its changelog's end and was last there longer ago than its
/// changelog keeps tombstones: following it on could miss deletes.
fn behind_tombstones(r: &Replica) -> Option<(&str, checkpoint::Distrust)> {
    let now = Instant::now();
    let now_ms = crate::record::now_ms();
    r.stores
        .iter()
        .filter(|s| s.lag(now) != Some(0))
        .find_map(|s| {
            let c = Checkpoint {
                offset: s.position,
                caught_up_at: s.caught_up_at,
            };
            // The end is not known to be current here: only the age counts.
            let why = checkpoint::check(c, i64::MIN, i64::MAX, s.tombstones, now_ms)?;
            Some((s.name.as_str(), why))
        })
}

/// Write a replica's pending records, each store's batch with its new checkpoint in one
/// atomic write; a store with nothing pending moves its checkpoint past control records. A
/// store at its changelog's end (against an end confirmed lately) records the time of that
/// confirmation as when it was last caught up.
fn apply(
    r: &mut Replica,
    metrics: &Metrics,
    positions: &HashMap<(String, i32), i64>,
    now: Instant,
) -> Result<(), StoreError> {
    let p = r.id.partition;
    let now_ms = crate::record::now_ms();
    for s in &mut r.stores {
        let batch = std::mem::take(&mut s.pending);
        let consumed = positions
            .get(&(s.changelog.clone(), p))
            .copied()
            .filter(|_| s.fresh)
            .unwrap_or(0);
        // Everything before the consumer's position was handed to `poll` and is in the
        // batch, so the checkpoint may go that far.
        let next = batch.next.max(consumed);
        let moves = next > s.position || batch.read > 0;
        let at_end = plan::lag(next.max(s.position), ends::fresh(s.end, s.end_at, now)) == Some(0);
        // The end reached was the end when the broker confirmed it.
        let confirmed_ms = s.end_at.map(|at| {
            let ago = now.saturating_duration_since(at).as_millis();
            now_ms.saturating_sub(i64::try_from(ago).unwrap_or(i64::MAX))
        });
        let caught_up_at = match (at_end, confirmed_ms) {
            (true, Some(at))
                if moves
                    || s.caught_up_at
                        .is_none_or(|t| at.saturating_sub(t) >= CAUGHT_UP_EVERY_MS) =>
            {
                Some(at)
            }
            _ if moves => s.meanwhile,
            _ => None,
        };
        if at_end {
            s.meanwhile = None;
        }
        if !moves && caught_up_at.is_none() {
            continue;
        }
        let mark = Mark {
            offset: moves.then_some(next),
            caught_up_at,
        };
        let changes: Changes = batch.latest.into_iter().collect();
        match (&mut s.memory, &r.db) {
            (Some(m), _) => m.apply([], &changes, mark),
            (None, Some(db)) => db.write(
                changes.iter().map(|(k, v)| {
                    (
                        s.name.as_str(),
                        Change {
                            key: k,
                            value: v.as_deref(),
                        },
                    )
                }),
                [(s.name.as_str(), mark)],
            )?,
            (None, None) => {}
        }
        s.position = next.max(s.position);
        if caught_up_at.is_some() {
            s.caught_up_at = caught_up_at;
        }
        if batch.read > 0 {
            metrics
                .standby_updated
                .get_or_create(&s.labels)
                .inc_by(batch.read);
        }
    }
    if !r.caught_up && r.lag(now) == Some(0) {
        r.caught_up = true;
        tracing::info!(task = %r.id, role = %r.role, "standby caught up with its changelogs");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHANGELOG: &str = "app-counts-changelog";

    /// A standby of one in-memory store at `position`, its changelog's end `end` confirmed
    /// just now.
    fn replica(position: i64, end: i64) -> Replica {
        Replica {
            id: TaskId::new(0, 1),
            role: TaskRole::Standby,
            db: None,
            stores: vec![ReplicaStore {
                name: "counts".into(),
                changelog: CHANGELOG.into(),
                memory: Some(MemoryStore::default()),
                position,
                end: Some(end),
                end_at: Some(Instant::now()),
                caught_up_at: None,
                meanwhile: None,
                tombstones: Some(86_400_000),
                pending: Pending::default(),
                fresh: false,
                labels: StoreLabels {
                    task: "0_1".into(),
                    store: "counts".into(),
                },
            }],
            caught_up: false,
            queryable: false,
        }
    }

    fn at(offset: i64) -> HashMap<(String, i32), i64> {
        HashMap::from([((CHANGELOG.to_string(), 1), offset)])
    }

    #[test]
    fn a_batch_is_applied_with_its_checkpoint_and_the_lag_falls() {
        let metrics = Metrics::new();
        let now = Instant::now();
        let mut r = replica(10, 14);
        assert_eq!(r.lag(now), Some(4));
        assert_eq!(r.report(now).state, TaskState::Restoring);
        let s = &mut r.stores[0];
        s.pending.add(b"a", Some(b"1"), 10);
        s.pending.add(b"a", Some(b"2"), 11);
        s.pending.add(b"b", None, 12);
        s.fresh = true;
        // The consumer is past the control record at 13.
        apply(&mut r, &metrics, &at(14), now).expect("apply");
        let m = r.stores[0].memory.as_ref().expect("memory").read();
        assert_eq!(
            m.map.get(b"a".as_slice()).map(Vec::as_slice),
            Some(b"2".as_slice())
        );
        assert_eq!(m.checkpoint, Some(14));
        assert!(
            m.caught_up_at
                .is_some_and(|t| (crate::record::now_ms() - t).abs() < 5_000),
            "at the end: caught up when the end was confirmed ({:?})",
            m.caught_up_at
        );
        drop(m);
        assert_eq!(r.lag(now), Some(0));
        assert!(r.caught_up);
        assert_eq!(r.report(now).state, TaskState::Running);
        assert_eq!(r.report(now).role, TaskRole::Standby);
    }

    #[test]
    fn a_position_from_before_the_assignment_does_not_move_the_checkpoint() {
        let metrics = Metrics::new();
        let now = Instant::now();
        let mut r = replica(5, 20);
        // Nothing read since the changelog was assigned: the consumer's position may be a
        // previous assignment's, and must not skip records the store lacks.
        apply(&mut r, &metrics, &at(20), now).expect("apply");
        assert_eq!(r.stores[0].position, 5);
        assert_eq!(r.lag(now), Some(15));
        assert!(!r.caught_up);
    }

    /// The lag of a copy whose changelog end nobody confirmed lately is unknown: a stalled
    /// consumer leaves the end where it was, and the lag would read 0 while the changelog
    /// grows.
    #[test]
    fn a_lag_against_an_end_not_confirmed_lately_is_unknown() {
        let metrics = Metrics::new();
        let mut r = replica(14, 14);
        let confirmed = Instant::now();
        r.stores[0].end_at = Some(confirmed);
        let later = confirmed + ends::FRESH_FOR + Duration::from_millis(1);
        assert_eq!(r.lag(confirmed + ends::FRESH_FOR), Some(0));
        assert_eq!(r.lag(later), None);
        assert_eq!(r.report(later).lag, None);
        apply(&mut r, &metrics, &at(14), later).expect("apply");
        assert!(!r.caught_up, "not RUNNING on a stale end");
        assert_eq!(
            r.stores[0]
                .memory
                .as_ref()
                .expect("memory")
                .read()
                .caught_up_at,
            None,
            "no time claimed"
        );
        // Never confirmed at all: unknown too.
        r.stores[0].end_at = None;
        assert_eq!(r.lag(confirmed), None);
        // Published: no series rather than the last number.
        let labels = r.stores[0].labels.clone();
        metrics.standby_lag.get_or_create(&labels).set(0);
        publish_lag(&metrics, &r, later);
        assert!(
            !metrics.encode().contains("eddy_standby_lag_records{"),
            "{}",
            metrics.encode()
        );
    }

    #[test]
    fn a_store_that_stays_at_the_end_says_so_now_and_then_and_one_left_behind_is_reopened() {
        let metrics = Metrics::new();
        let now = Instant::now();
        let now_ms = crate::record::now_ms();
        let mut r = replica(14, 14);
        r.stores[0].caught_up_at = Some(now_ms - 1_000);
        apply(&mut r, &metrics, &HashMap::new(), now).expect("apply");
        assert_eq!(
            r.stores[0]
                .memory
                .as_ref()
                .expect("memory")
                .read()
                .caught_up_at,
            None,
            "a second ago is recent enough: nothing written"
        );
        r.stores[0].caught_up_at = Some(now_ms - CAUGHT_UP_EVERY_MS - 1_000);
        apply(&mut r, &metrics, &HashMap::new(), now).expect("apply");
        let written = r.stores[0]
            .memory
            .as_ref()
            .expect("memory")
            .read()
            .caught_up_at;
        assert!(written.is_some_and(|t| t >= now_ms - 1_000), "{written:?}");
        assert_eq!(behind_tombstones(&r).map(|(s, _)| s), None);
        // Behind, and last caught up longer ago than the changelog keeps tombstones.
        let mut r = replica(5, 20);
        r.stores[0].caught_up_at = Some(now_ms - 86_400_000);
        let (store, why) = behind_tombstones(&r).expect("too old");
        assert_eq!((store, why.reason()), ("counts", "tombstones_expired"));
        r.stores[0].tombstones = None;
        assert!(behind_tombstones(&r).is_none(), "not compacted: no age");
    }
}
