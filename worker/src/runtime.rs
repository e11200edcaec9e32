//! The processing loop (Kafka Streams' StreamThread and TaskManager in one): prepares topics,
//! creates and restores tasks, consumes their input partitions by manual assignment, routes
//! records to tasks and commits all of them every commit interval.
//!
//! Commit order (the same for both guarantees): flush every task's cache to the changelog;
//! then the Kafka commit (exactly-once: each task's transaction with its input offsets;
//! at-least-once: wait for all deliveries, then commit the input offsets); only then write the
//! flushed state and the changelog offsets to each store. A crash anywhere in between leaves
//! the stores at the previous commit, and restore replays the changelog tail from there.

use crate::changelog::{self, TopicError};
use crate::collector::{self, Collector};
use crate::config::WorkerConfig;
use crate::metrics::{Metrics, PartitionLabels};
use crate::record::Origin;
use crate::restore::{self, RestoreError, Restored};
use crate::store::{StateResources, StoreError};
use crate::task::{Task, TaskError, TaskState};
use eddy_crds::TaskId;
use eddy_crds::resource::{TaskStatus, WorkerStatus};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::Producer as _;
use rdkafka::statistics::Statistics;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Topics(#[from] TopicError),
    #[error(transparent)]
    Task(#[from] TaskError),
    #[error(transparent)]
    Restore(#[from] RestoreError),
    #[error("state stores: {0}")]
    Store(#[from] StoreError),
    #[error("{what}: {source}")]
    Kafka {
        what: String,
        #[source]
        source: KafkaError,
    },
    #[error("{0}")]
    Delivery(String),
}

fn kafka(what: impl Into<String>) -> impl FnOnce(KafkaError) -> RuntimeError {
    let what = what.into();
    move |source| RuntimeError::Kafka { what, source }
}

/// Shared with the HTTP server, the operator link and the embedding application.
#[derive(Default)]
pub struct Status {
    /// True once every active task is RUNNING.
    pub ready: AtomicBool,
    /// Set to ask the loop to commit, close cleanly and return.
    pub shutdown: AtomicBool,
    /// What the last restore did, for tests and logs.
    pub restored: Mutex<Restored>,
    /// Run the tasks in `desired` instead of every task (set when the operator assigns).
    pub follow_assignment: bool,
    /// The operator's assignment for this worker: (generation, active tasks).
    pub desired: Mutex<Option<(i64, Vec<TaskId>)>>,
    /// What this worker runs, for its entry in the app's `status.workers`.
    pub report: Mutex<WorkerStatus>,
}

/// Feeds consumer lag from librdkafka's statistics into the metrics, without extra requests.
struct LagReporter(Arc<Metrics>);

impl ClientContext for LagReporter {
    fn stats(&self, stats: Statistics) {
        for (topic, t) in stats.topics {
            for (p, part) in t.partitions {
                if p >= 0 && part.consumer_lag >= 0 {
                    self.0
                        .consumer_lag
                        .get_or_create(&PartitionLabels {
                            topic: topic.clone(),
                            partition: p,
                        })
                        .set(part.consumer_lag);
                }
            }
        }
    }
}
impl ConsumerContext for LagReporter {}

/// Run the app until `status.shutdown` is set or a task fails. Standalone, the worker owns
/// every task; under the operator (`status.follow_assignment`) it runs the tasks the operator
/// assigned to it, and takes or releases tasks when that assignment changes.
pub fn run(
    cfg: &WorkerConfig,
    metrics: Arc<Metrics>,
    status: Arc<Status>,
) -> Result<(), RuntimeError> {
    let counts = Arc::new(changelog::prepare(cfg)?);
    let consumer: BaseConsumer<LagReporter> = cfg
        .client_config()
        .set("group.id", &cfg.application_id)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("statistics.interval.ms", "5000")
        .set("queued.max.messages.kbytes", "16384")
        .set("fetch.max.bytes", "52428800")
        .create_with_context(LagReporter(metrics.clone()))
        .map_err(kafka("creating the consumer"))?;
    let shared = if cfg.exactly_once() {
        None
    } else {
        Some(collector::producer(cfg, None).map_err(kafka("creating the producer"))?)
    };
    let mut m = Manager {
        cfg,
        counts,
        resources: StateResources::new(cfg.rocksdb_bytes)?,
        consumer,
        shared,
        metrics,
        status,
        tasks: Vec::new(),
        applied: None,
    };
    let result = m.run_loop();
    m.status.ready.store(false, Ordering::Relaxed);
    match result {
        Ok(()) => {
            for t in &mut m.tasks {
                t.close()?;
            }
            tracing::info!("all tasks committed and closed");
            Ok(())
        }
        Err(e) => {
            // Nothing after the last commit is kept: aborted transactions (exactly-once) or
            // uncommitted offsets (at-least-once) make the next run redo it.
            if cfg.exactly_once() {
                for t in &m.tasks {
                    let _ = t
                        .collector
                        .producer
                        .abort_transaction(Duration::from_secs(10));
                }
            }
            Err(e)
        }
    }
}

/// The tasks of this process and the clients they share (Kafka Streams' TaskManager).
struct Manager<'a> {
    cfg: &'a WorkerConfig,
    counts: Arc<changelog::PartitionCounts>,
    resources: StateResources,
    consumer: BaseConsumer<LagReporter>,
    shared: Option<Arc<collector::Producer>>,
    metrics: Arc<Metrics>,
    status: Arc<Status>,
    tasks: Vec<Task>,
    /// Generation of the assignment the tasks follow (None before the first).
    applied: Option<i64>,
}

impl Manager<'_> {
    fn run_loop(&mut self) -> Result<(), RuntimeError> {
        let mut route = Router::new(&self.tasks);
        let mut next_commit = Instant::now() + self.cfg.commit_interval;
        while !self.status.shutdown.load(Ordering::Relaxed) {
            if let Some((generation, ids)) = self.wanted() {
                self.change(&ids)?;
                self.applied = Some(generation);
                route = Router::new(&self.tasks);
                self.report();
            }
            if self.applied.is_none() {
                // Under the operator, nothing to do until the first assignment arrives.
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            // Bounded batches keep the commit timer honest under a full input.
            for _ in 0..2000 {
                let Some(msg) = self.consumer.poll(Duration::from_millis(50)) else {
                    break;
                };
                let msg = msg.map_err(kafka("consuming"))?;
                let Some(ti) = route.task(msg.topic(), msg.partition()) else {
                    continue;
                };
                let origin = Origin {
                    topic: msg.topic(),
                    partition: msg.partition(),
                    offset: msg.offset(),
                    key: msg.key(),
                    value: msg.payload(),
                };
                self.tasks[ti].process(&origin, msg.timestamp().to_millis().unwrap_or(-1))?;
                if self.tasks[ti].wants_commit() {
                    next_commit = Instant::now();
                }
                if Instant::now() >= next_commit {
                    break;
                }
            }
            if Instant::now() >= next_commit {
                commit(self.cfg, &self.consumer, &mut self.tasks, &self.metrics)?;
                next_commit = Instant::now() + self.cfg.commit_interval;
            }
        }
        commit(self.cfg, &self.consumer, &mut self.tasks, &self.metrics)
    }

    /// Every task of the app, as (sub-topology index, id).
    fn all_tasks(&self) -> Vec<TaskId> {
        self.cfg
            .topology
            .subtopologies
            .iter()
            .flat_map(|s| {
                (0..self.counts.get(&s.source.topic).copied().unwrap_or(0))
                    .map(move |p| TaskId::new(s.id, p))
            })
            .collect()
    }

    /// The task set to switch to, if it changed.
    fn wanted(&self) -> Option<(i64, Vec<TaskId>)> {
        if !self.status.follow_assignment {
            return self.applied.is_none().then(|| (0, self.all_tasks()));
        }
        let desired = self.status.desired.lock().ok()?.clone()?;
        if Some(desired.0) == self.applied {
            return None;
        }
        let all = self.all_tasks();
        let (known, unknown): (Vec<TaskId>, Vec<TaskId>) =
            desired.1.into_iter().partition(|t| all.contains(t));
        if !unknown.is_empty() {
            tracing::warn!(?unknown, "ignoring assigned tasks this app does not have");
        }
        Some((desired.0, known))
    }

    /// Release the tasks not in `ids` (after committing them) and take the new ones
    /// (restoring them before they process).
    fn change(&mut self, ids: &[TaskId]) -> Result<(), RuntimeError> {
        if self.tasks.iter().any(|t| !ids.contains(&t.id)) {
            // Released tasks hand over committed state: commit everything first.
            commit(self.cfg, &self.consumer, &mut self.tasks, &self.metrics)?;
            let (keep, release): (Vec<Task>, Vec<Task>) = std::mem::take(&mut self.tasks)
                .into_iter()
                .partition(|t| ids.contains(&t.id));
            self.tasks = keep;
            let mut tpl = TopicPartitionList::new();
            for mut t in release {
                tpl.add_partition(&t.input_topic, t.id.partition);
                // The commit opened a new, empty transaction: end it before dropping the
                // producer.
                if self.cfg.exactly_once() {
                    let _ = t
                        .collector
                        .producer
                        .abort_transaction(Duration::from_secs(10));
                }
                t.close()?;
                tracing::info!(task = %t.id, "task released");
            }
            self.consumer
                .incremental_unassign(&tpl)
                .map_err(kafka("unassigning released partitions"))?;
        }
        let new: Vec<TaskId> = ids
            .iter()
            .filter(|id| !self.tasks.iter().any(|t| t.id == **id))
            .copied()
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        self.status.ready.store(false, Ordering::Relaxed);
        let mut added = self.create(&new)?;
        self.report_tasks(&added);
        let restored = restore::restore(
            self.cfg,
            &mut added,
            &self.resources,
            &self.metrics,
            &self.status,
        )?;
        if let Ok(mut r) = self.status.restored.lock() {
            *r = restored;
        }
        // Resume each input partition where the last commit left it. On a fresh cluster the
        // group coordinator may still be loading: retry those answers.
        let mut tpl = TopicPartitionList::new();
        for t in &added {
            tpl.add_partition(&t.input_topic, t.id.partition);
        }
        let committed = retry(Duration::from_secs(60), || {
            self.consumer
                .committed_offsets(tpl.clone(), Duration::from_secs(30))
        })
        .map_err(kafka("reading committed offsets"))?;
        let mut assignment = TopicPartitionList::new();
        for e in committed.elements() {
            let offset = match e.offset() {
                Offset::Offset(o) => Offset::Offset(o),
                _ => Offset::Beginning,
            };
            assignment
                .add_partition_offset(e.topic(), e.partition(), offset)
                .map_err(kafka("building the assignment"))?;
        }
        self.consumer
            .incremental_assign(&assignment)
            .map_err(kafka("assigning input partitions"))?;
        for t in &mut added {
            if self.cfg.exactly_once() {
                t.collector
                    .producer
                    .begin_transaction()
                    .map_err(kafka(format!("beginning a transaction for task {}", t.id)))?;
            }
            t.transition(TaskState::Running);
        }
        self.tasks.extend(added);
        self.status.ready.store(true, Ordering::Relaxed);
        tracing::info!(tasks = self.tasks.len(), "all tasks running");
        Ok(())
    }

    /// Create tasks (not yet restored). Under exactly-once each task has its own
    /// transactional producer; initializing one fences any zombie owner of the task and
    /// aborts its open transaction (so the changelog's committed end is known before
    /// restoring). Done in parallel: each is a few round trips to the coordinator.
    fn create(&self, ids: &[TaskId]) -> Result<Vec<Task>, RuntimeError> {
        let cfg = self.cfg;
        let producers: Vec<Arc<collector::Producer>> = match &self.shared {
            Some(p) => ids.iter().map(|_| p.clone()).collect(),
            None => std::thread::scope(|scope| {
                let handles: Vec<_> = ids
                    .iter()
                    .map(|id| {
                        scope.spawn(move || {
                            let txn_id = format!("{}-{}", cfg.application_id, id);
                            let p = collector::producer(cfg, Some(&txn_id))
                                .map_err(kafka(format!("producer {txn_id}")))?;
                            p.init_transactions(Duration::from_secs(60))
                                .map_err(kafka(format!("initializing transactions of {txn_id}")))?;
                            Ok(p)
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(RuntimeError::Delivery("a producer thread panicked".into()))
                        })
                    })
                    .collect::<Result<Vec<_>, RuntimeError>>()
            })?,
        };
        let cache_share = cfg.record_cache_bytes / (self.tasks.len() + ids.len()).max(1);
        let mut out = Vec::with_capacity(ids.len());
        for (id, producer) in ids.iter().zip(producers) {
            let Some(sub) = cfg
                .topology
                .subtopologies
                .iter()
                .find(|s| s.id == id.subtopology)
            else {
                continue;
            };
            let collector = Collector::new(producer, self.counts.clone());
            out.push(Task::new(
                cfg,
                sub,
                id.partition,
                &self.resources,
                collector,
                cache_share,
                self.metrics.clone(),
            )?);
        }
        Ok(out)
    }

    fn report_tasks(&self, extra: &[Task]) {
        let Ok(mut r) = self.status.report.lock() else {
            return;
        };
        r.applied_generation = self.applied.unwrap_or(0);
        r.tasks = self
            .tasks
            .iter()
            .chain(extra)
            .map(|t| {
                (
                    t.id.to_string(),
                    TaskStatus {
                        state: t.state.name().to_string(),
                        restore_backlog: 0,
                        lag: None,
                    },
                )
            })
            .collect();
    }

    fn report(&self) {
        self.report_tasks(&[]);
    }
}

/// Commit every task that processed something since the last commit.
fn commit(
    cfg: &WorkerConfig,
    consumer: &BaseConsumer<LagReporter>,
    tasks: &mut [Task],
    metrics: &Metrics,
) -> Result<(), RuntimeError> {
    let started = Instant::now();
    let dirty: Vec<usize> = (0..tasks.len())
        .filter(|&i| {
            tasks[i].next_offset.is_some() || tasks[i].stores().iter().any(|s| s.bytes() > 0)
        })
        .collect();
    if dirty.is_empty() {
        return Ok(());
    }
    for &i in &dirty {
        tasks[i].flush()?;
    }
    if cfg.exactly_once() {
        let group = consumer
            .group_metadata()
            .ok_or_else(|| RuntimeError::Delivery("the consumer has no group metadata".into()))?;
        // Each task commits its own transaction; they are independent, so commit them in
        // parallel: a commit is a few broker round trips, mostly waiting.
        let jobs: Vec<_> = dirty
            .iter()
            .map(|&i| {
                let t = &tasks[i];
                (
                    t.id,
                    t.collector.producer.clone(),
                    t.input_topic.clone(),
                    t.next_offset,
                )
            })
            .collect();
        let group = &group;
        std::thread::scope(|scope| {
            let handles: Vec<_> = jobs
                .chunks(jobs.len().div_ceil(COMMIT_THREADS))
                .map(|chunk| {
                    scope.spawn(move || {
                        chunk
                            .iter()
                            .try_for_each(|job| commit_transaction(job, group))
                    })
                })
                .collect();
            handles.into_iter().try_for_each(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(RuntimeError::Delivery("a commit thread panicked".into()))
                })
            })
        })?;
    } else {
        if let Some(t) = tasks.first() {
            t.collector
                .producer
                .flush(Duration::from_secs(60))
                .map_err(kafka("waiting for deliveries"))?;
            if let Some(e) = t.collector.take_error() {
                return Err(RuntimeError::Delivery(e));
            }
        }
        let mut tpl = TopicPartitionList::new();
        for &i in &dirty {
            if let Some(o) = tasks[i].next_offset {
                tpl.add_partition_offset(
                    &tasks[i].input_topic,
                    tasks[i].id.partition,
                    Offset::Offset(o),
                )
                .map_err(kafka("building offsets"))?;
            }
        }
        if tpl.count() > 0 {
            consumer
                .commit(&tpl, CommitMode::Sync)
                .map_err(kafka("committing offsets"))?;
        }
    }
    for &i in &dirty {
        tasks[i].write_committed()?;
    }
    metrics.commits.inc();
    metrics
        .commit_seconds
        .observe(started.elapsed().as_secs_f64());
    Ok(())
}

/// Retry a Kafka call while it fails with an error that goes away by itself (a coordinator
/// loading or moving), up to `timeout`.
fn retry<T>(
    timeout: Duration,
    mut f: impl FnMut() -> Result<T, KafkaError>,
) -> Result<T, KafkaError> {
    use rdkafka::types::RDKafkaErrorCode::*;
    let deadline = Instant::now() + timeout;
    loop {
        match f() {
            Err(e)
                if Instant::now() < deadline
                    && matches!(
                        e.rdkafka_error_code(),
                        Some(
                            NotCoordinator
                                | CoordinatorLoadInProgress
                                | CoordinatorNotAvailable
                                | RequestTimedOut
                        )
                    ) =>
            {
                tracing::debug!("retrying: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
            r => return r,
        }
    }
}

/// Threads committing transactions at once under exactly-once.
const COMMIT_THREADS: usize = 8;

type TxnJob = (TaskId, Arc<collector::Producer>, String, Option<i64>);

/// Commit one task's transaction, with its input offset, and open the next one.
fn commit_transaction(
    (id, p, topic, offset): &TxnJob,
    group: &rdkafka::consumer::ConsumerGroupMetadata,
) -> Result<(), RuntimeError> {
    if let Some(o) = offset {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, id.partition, Offset::Offset(*o))
            .map_err(kafka("building offsets"))?;
        p.send_offsets_to_transaction(&tpl, group, Duration::from_secs(30))
            .map_err(kafka(format!("sending offsets of task {id}")))?;
    }
    p.commit_transaction(Duration::from_secs(60))
        .map_err(kafka(format!("committing the transaction of task {id}")))?;
    p.begin_transaction()
        .map_err(kafka(format!("beginning a transaction for task {id}")))
}

/// Maps an input (topic, partition) to the task that owns it.
struct Router {
    topics: Vec<(String, HashMap<i32, usize>)>,
}

impl Router {
    fn new(tasks: &[Task]) -> Self {
        let mut topics: Vec<(String, HashMap<i32, usize>)> = Vec::new();
        for (i, t) in tasks.iter().enumerate() {
            match topics.iter_mut().find(|(n, _)| *n == t.input_topic) {
                Some((_, m)) => {
                    m.insert(t.id.partition, i);
                }
                None => topics.push((t.input_topic.clone(), HashMap::from([(t.id.partition, i)]))),
            }
        }
        Self { topics }
    }

    fn task(&self, topic: &str, partition: i32) -> Option<usize> {
        self.topics
            .iter()
            .find(|(n, _)| n == topic)
            .and_then(|(_, m)| m.get(&partition).copied())
    }
}
