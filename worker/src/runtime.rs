//! The processing loop (Kafka Streams' StreamThread and TaskManager in one): prepares topics,
//! creates and restores tasks, consumes their input partitions by manual assignment, routes
//! records to tasks and commits all of them every commit interval.
//!
//! Commit order (the same for both guarantees): flush every task's cache to the changelog;
//! then the Kafka commit (exactly-once: each task's transaction with its input offsets;
//! at-least-once: wait for all deliveries, then commit the input offsets); only then write the
//! flushed state and the changelog offsets to each store. A crash anywhere in between leaves
//! the stores at the previous commit, and restore replays the changelog tail from there.
//!
//! Faults are handled the same way without a crash: an error that can go away (brokers
//! unreachable, a transaction aborted or fenced, records not delivered, a full disk) drops
//! every task's uncommitted work ("closes it dirty", as Kafka Streams does), re-creates the
//! producer, and takes the tasks again from the last commit after a back-off, as often as it
//! takes. Only errors retrying cannot fix stop the worker ([`RuntimeError::is_recoverable`]).

use crate::changelog::{self, TopicError, Topics};
use crate::collector::{self, Collector, DeliveryError};
use crate::config::WorkerConfig;
use crate::fault;
use crate::global::{GlobalError, GlobalThreads};
use crate::metrics::{Metrics, PartitionLabels, ReasonLabels};
use crate::plan::{self, Desired};
use crate::processor::ProcessError;
use crate::record::Origin;
use crate::restore::{self, RestoreError, Restored};
use crate::status::LeaseLapsed;
pub use crate::status::{Peer, Status};
use crate::store::{StateResources, StoreError};
use crate::task::{Position, Task, TaskError, TaskState, input};
use crate::updater::{MemoryStores, Updater, UpdaterError};
use eddy_crds::TaskId;
use eddy_crds::resource::{TaskRole, TaskStatus, WorkerProblem, WorkerProblemReason};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{Producer as _, PurgeConfig};
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
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{what}: {cause}")]
    Kafka { what: String, cause: KafkaError },
    #[error(transparent)]
    Delivery(#[from] DeliveryError),
    #[error("the consumer has no group metadata")]
    NoGroupMetadata,
    #[error("input partitions have had no known leader for {} s", .0.as_secs())]
    Leaderless(Duration),
    #[error("committing input offsets got no answer in {} s (group coordinator unreachable)", .0.as_secs())]
    CommitStalled(Duration),
    #[error("standby tasks: {0}")]
    Updater(UpdaterError),
    #[error(transparent)]
    Global(#[from] GlobalError),
    #[error(transparent)]
    Lease(#[from] LeaseLapsed),
}

impl RuntimeError {
    /// True when dropping the uncommitted work and resuming from the last commit can fix it:
    /// Kafka errors that go away by themselves and state-store I/O errors. Bad records under
    /// `onError: fail`, permissions, configuration and corrupt state are not.
    pub fn is_recoverable(&self) -> bool {
        match self {
            RuntimeError::Topics(e) => e.is_transient(),
            RuntimeError::Task(TaskError::Process { cause: source, .. }) => match source {
                ProcessError::Send { cause: source, .. } => !fault::is_fatal(source),
                ProcessError::Store(e) => e.is_transient(),
                ProcessError::Lease(_) => true,
                _ => false,
            },
            RuntimeError::Task(TaskError::Store { cause: source, .. })
            | RuntimeError::Restore(RestoreError::Store { cause: source, .. })
            | RuntimeError::Store(source) => source.is_transient(),
            RuntimeError::Task(TaskError::BadRecord { .. }) => false,
            RuntimeError::Restore(RestoreError::Kafka { cause: source, .. })
            | RuntimeError::Kafka { cause: source, .. } => !fault::is_fatal(source),
            RuntimeError::Restore(
                RestoreError::Interrupted | RestoreError::Spawn(_) | RestoreError::WriterStopped,
            ) => false,
            RuntimeError::Delivery(d) => !fault::is_fatal_code(d.code),
            RuntimeError::NoGroupMetadata
            | RuntimeError::CommitStalled(_)
            | RuntimeError::Leaderless(_)
            | RuntimeError::Lease(_) => true,
            RuntimeError::Updater(_) => false,
            RuntimeError::Global(e) => match e {
                GlobalError::Kafka { cause: source, .. } => !fault::is_fatal(source),
                GlobalError::Store(e) => e.is_transient(),
                GlobalError::NoPartitions { .. } | GlobalError::Died(_) => true,
                GlobalError::Spawn(_) => false,
            },
        }
    }

    /// What to fix, for errors that name a permission or a setting.
    pub fn hint(&self) -> Option<&'static str> {
        let code = match self {
            RuntimeError::Kafka { cause: source, .. }
            | RuntimeError::Restore(RestoreError::Kafka { cause: source, .. })
            | RuntimeError::Task(TaskError::Process {
                cause: ProcessError::Send { cause: source, .. },
                ..
            }) => source.rdkafka_error_code()?,
            RuntimeError::Delivery(d) => d.code,
            RuntimeError::Topics(TopicError::Unreachable { cause: source, .. }) => {
                source.rdkafka_error_code()?
            }
            RuntimeError::Topics(
                TopicError::Create { code, .. } | TopicError::Configs { code, .. },
            ) => *code,
            _ => return None,
        };
        fault::is_fatal_code(code).then(|| fault::hint(code))
    }

    /// Why the worker waits, for its status report and metrics.
    fn reason(&self) -> WorkerProblemReason {
        match self {
            RuntimeError::Task(TaskError::Store { .. })
            | RuntimeError::Task(TaskError::Process {
                cause: ProcessError::Store(_),
                ..
            })
            | RuntimeError::Restore(RestoreError::Store { .. })
            | RuntimeError::Global(GlobalError::Store(_))
            | RuntimeError::Store(_) => WorkerProblemReason::StateStoreUnavailable,
            RuntimeError::Lease(_)
            | RuntimeError::Task(TaskError::Process {
                cause: ProcessError::Lease(_),
                ..
            }) => WorkerProblemReason::ApiServerUnreachable,
            _ => WorkerProblemReason::KafkaUnavailable,
        }
    }

    /// A broker rejected a record for what it is (too large, invalid): recovering helps only
    /// if the topic's limits changed, so it is retried a few times, not forever.
    fn is_record_rejection(&self) -> bool {
        use rdkafka::types::RDKafkaErrorCode::*;
        matches!(self, RuntimeError::Delivery(d) if matches!(d.code,
            MessageSizeTooLarge | MessageBatchTooLarge | InvalidRecord | InvalidMessage
                | InvalidMessageSize | InvalidTimestamp | PolicyViolation ))
    }
}

fn kafka(what: impl Into<String>) -> impl FnOnce(KafkaError) -> RuntimeError {
    let what = what.into();
    move |source| RuntimeError::Kafka {
        what,
        cause: source,
    }
}

/// Feeds consumer lag from librdkafka's statistics into the metrics, without extra requests,
/// and notices input partitions left without a known leader.
struct LagReporter {
    metrics: Arc<Metrics>,
    /// The sub-topology reading each input topic: a partition's task is `<sub>_<partition>`.
    subtopologies: HashMap<String, u32>,
    /// Since when some fetched partition has had no known leader (None: all have one).
    leaderless_since: Mutex<Option<Instant>>,
    /// Per input partition, the offset librdkafka's fetcher had reached with nothing left in
    /// its queue, as of the last statistics: what lies before it and never came as a record
    /// was transaction markers or aborted records.
    fetched_past: Mutex<HashMap<(String, i32), i64>>,
}

impl LagReporter {
    fn new(metrics: Arc<Metrics>, cfg: &WorkerConfig) -> Self {
        Self {
            metrics,
            subtopologies: cfg
                .topology
                .subtopologies
                .iter()
                .flat_map(|s| s.inputs.iter().map(|i| (i.source.topic.clone(), s.id)))
                .collect(),
            leaderless_since: Mutex::new(None),
            fetched_past: Mutex::new(HashMap::new()),
        }
    }

    /// How far librdkafka's fetcher had read `topic`'s `partition`, all of it handed over, as
    /// of the last statistics (see [`Self::fetched_past`]).
    fn fetched_past(&self, topic: &str, partition: i32) -> Option<i64> {
        let map = self.fetched_past.lock().ok()?;
        map.get(&(topic.to_string(), partition)).copied()
    }

    /// How long some fetched partition has had no known leader, as of the last statistics.
    fn leaderless_for(&self) -> Duration {
        self.leaderless_since
            .lock()
            .ok()
            .and_then(|s| s.map(|t| t.elapsed()))
            .unwrap_or_default()
    }
}

impl ClientContext for LagReporter {
    fn stats(&self, stats: Statistics) {
        let mut leaderless = false;
        let (mut lags, mut fetched_past) = (Vec::new(), Vec::new());
        for (topic, t) in stats.topics {
            let sub = self.subtopologies.get(&topic).copied();
            for (p, part) in t.partitions {
                if p < 0 {
                    continue;
                }
                leaderless |=
                    part.leader < 0 && !matches!(part.fetch_state.as_str(), "none" | "stopped");
                // Partitions known from metadata but not assigned (any more) are listed too.
                if matches!(part.fetch_state.as_str(), "none" | "stopping" | "stopped") {
                    continue;
                }
                let labels = PartitionLabels {
                    task: sub.map_or_else(String::new, |s| TaskId::new(s, p).to_string()),
                    topic: topic.clone(),
                    partition: p,
                };
                lags.push((labels, input_lag(&part)));
                if part.fetchq_cnt == 0 && part.next_offset >= 0 {
                    fetched_past.push(((topic.clone(), p), part.next_offset));
                }
            }
        }
        if let Ok(mut map) = self.fetched_past.lock() {
            map.clear();
            map.extend(fetched_past);
        }
        self.metrics.set_consumer_lags(lags);
        if let Ok(mut since) = self.leaderless_since.lock() {
            match (leaderless, *since) {
                (true, None) => *since = Some(Instant::now()),
                (false, _) => *since = None,
                _ => {}
            }
        }
    }
}
impl ConsumerContext for LagReporter {}

/// Records between the consumer's position in a partition and its end (the last stable
/// offset: the consumer reads committed records only), or None when either is not known.
/// librdkafka's own `consumer_lag` counts from the offset this consumer committed, which under
/// exactly-once it never does (offsets go with the transaction), and its `consumer_lag_stored`
/// is unknown until a record arrives after an assignment. With nothing prefetched the position
/// is the next offset to fetch (past transaction markers), else the application's offset.
fn input_lag(part: &rdkafka::statistics::Partition) -> Option<i64> {
    let end = if part.ls_offset >= 0 {
        part.ls_offset
    } else {
        part.hi_offset
    };
    let position = if part.fetchq_cnt == 0 && part.next_offset >= 0 {
        part.next_offset
    } else if part.app_offset >= 0 {
        part.app_offset
    } else {
        part.next_offset
    };
    (end >= 0 && position >= 0).then(|| (end - position).max(0))
}

/// Run the app until `status.shutdown` is set or an error that retrying cannot fix.
/// Standalone, the worker owns every task; under the operator (`status.follow_assignment`)
/// it runs the tasks the operator assigned to it, and takes or releases tasks when that
/// assignment changes.
pub fn run(
    cfg: &WorkerConfig,
    metrics: Arc<Metrics>,
    status: Arc<Status>,
) -> Result<(), RuntimeError> {
    status.queries.set_app(cfg);
    let consumer = input_consumer(cfg, &metrics)?;
    let resources = Arc::new(StateResources::new(cfg.rocksdb_bytes)?);
    metrics.set_memory_source("rocksdb", resources.clone());
    metrics.set_memory_budget(cfg.rocksdb_bytes + cfg.record_cache_bytes);
    let mut m = Manager {
        cfg,
        topics: None,
        resources,
        consumer,
        producer: None,
        in_transaction: false,
        metrics,
        status,
        tasks: Vec::new(),
        applied: None,
        stale: false,
        backoff: recovery_backoff(),
        rejections: 0,
        last_poll_warning: None,
        paused: Vec::new(),
        updater: None,
        fenced: Vec::new(),
        jobs: Vec::new(),
        globals: None,
        dropped_at: Instant::now(),
        waiting_for: Vec::new(),
        caught_up_marked: Instant::now(),
    };
    // The first tasks come from an assignment acknowledged after this start.
    m.status.confirm_soon();
    let result = m.supervise();
    if let Some(g) = m.globals.take() {
        m.status.queries.withdraw_global();
        g.stop();
    }
    m.status.ready.store(false, Ordering::Relaxed);
    for j in std::mem::take(&mut m.jobs) {
        j.cancel();
    }
    // Standbys' checkpoints written, their databases closed (whatever the outcome).
    if let Some(mut u) = m.updater.take() {
        u.stop();
    }
    match result {
        Ok(()) => {
            for t in &mut m.tasks {
                t.close()?;
            }
            tracing::info!("all tasks committed and closed");
            if m.status.follow_assignment {
                // Say so before exiting: the operator moves an at-least-once pod's tasks at
                // once when its last report holds none, rather than waiting out its lease.
                m.tasks.clear();
                m.report();
                m.status.report_soon();
                m.status.await_report(Duration::from_secs(2));
            }
            Ok(())
        }
        Err(e) => {
            // Nothing after the last commit is kept: the aborted transaction (exactly-once)
            // or uncommitted offsets (at-least-once) make the next run redo it.
            if m.in_transaction
                && let Some(p) = &m.producer
            {
                let _ = p.abort_transaction(Duration::from_secs(10));
            }
            Err(e)
        }
    }
}

/// librdkafka settings of the input consumer under the app's `kafka.properties`; public so
/// the engine benchmark's raw clients (its ceilings) read with exactly the same tuning.
pub const INPUT_CONSUMER_TUNING: &[(&str, &str)] = &[
    // librdkafka waits a whole second (its default) before fetching again for a
    // partition whose queue was full; a busy task drains it in milliseconds.
    ("fetch.queue.backoff.ms", "10"),
    ("queued.max.messages.kbytes", "16384"),
    // A fetched record keeps its whole fetch response in memory (librdkafka does not copy
    // uncompressed records out of it) until it is consumed: with 1 MiB per partition and 50 MiB
    // per response (its defaults), a few records left of each of several responses held ~100
    // MiB (the stream-stream join at 1M records, 24 partitions: peak RSS 345 -> 253 MiB, no
    // slower). Smaller responses, and fewer records queued ahead of the task, bound that.
    ("fetch.max.bytes", "8388608"),
    ("max.partition.fetch.bytes", "262144"),
    ("queued.min.messages", "20000"),
];

/// `fetch.max.bytes` of [`INPUT_CONSUMER_TUNING`].
const INPUT_FETCH_MAX_BYTES: u64 = 8 << 20;

/// The consumer of the input partitions (manually assigned, offsets committed to the app's
/// group).
fn input_consumer(
    cfg: &WorkerConfig,
    metrics: &Arc<Metrics>,
) -> Result<Arc<BaseConsumer<LagReporter>>, RuntimeError> {
    let mut defaults = vec![("statistics.interval.ms", "5000")];
    defaults.extend_from_slice(INPUT_CONSUMER_TUNING);
    // librdkafka refuses a `fetch.max.bytes` below `message.max.bytes`: an app raising the
    // latter for large records gets a response size to match.
    let fetch_max = cfg
        .spec
        .kafka
        .properties
        .get("message.max.bytes")
        .and_then(|m| m.trim().parse::<u64>().ok())
        .filter(|m| *m > INPUT_FETCH_MAX_BYTES)
        .map(|m| m.to_string());
    if let Some(m) = &fetch_max {
        defaults.push(("fetch.max.bytes", m));
    }
    cfg.client_config_with(&defaults)
        .set("group.id", &cfg.application_id)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .create_with_context(LagReporter::new(metrics.clone(), cfg))
        .map(Arc::new)
        .map_err(kafka("creating the consumer"))
}

/// Back-off between recoveries: short for a blip, at most 10 s while something stays down,
/// each wait plus up to as much again at random, so that the workers of a cluster do not all
/// come back in step after a broker outage.
const MIN_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

fn recovery_backoff() -> backon::ExponentialBackoff {
    use backon::BackoffBuilder as _;
    backon::ExponentialBuilder::new()
        .with_min_delay(MIN_BACKOFF)
        .with_max_delay(MAX_BACKOFF)
        .with_jitter()
        .without_max_times()
        .build()
}

/// A broker rejecting records this many times in a row, with no commit in between, is not
/// fixed by retrying: the worker stops with the broker's reason.
const MAX_REJECTIONS: u32 = 3;

/// The tasks of this process and the clients they share (Kafka Streams' TaskManager).
struct Manager<'a> {
    cfg: &'a WorkerConfig,
    /// Partition counts and record limits of the app's topics, learned at (re)start.
    topics: Option<Arc<Topics>>,
    resources: Arc<StateResources>,
    /// Shared with a commit that may not return (see [`commit_offsets`]).
    consumer: Arc<BaseConsumer<LagReporter>>,
    /// The worker's producer, shared by its tasks; None until Kafka answered, and again
    /// after a recovery dropped it.
    producer: Option<Arc<collector::Producer>>,
    /// Exactly-once: a transaction is open on `producer`.
    in_transaction: bool,
    metrics: Arc<Metrics>,
    status: Arc<Status>,
    tasks: Vec<Task>,
    /// Generation of the assignment the tasks follow (None before the first).
    applied: Option<i64>,
    /// A recovery dropped the tasks: take the assigned ones again.
    stale: bool,
    /// The waits before the next attempts after recoverable errors.
    backoff: backon::ExponentialBackoff,
    /// Record rejections by a broker since the last commit.
    rejections: u32,
    /// Poll errors librdkafka recovers from are logged at most every few seconds.
    last_poll_warning: Option<Instant>,
    /// The state updater following this worker's standby and warm-up tasks (started with
    /// the first one).
    updater: Option<Updater>,
    /// Failed-over pods whose transactional id this worker fenced (exactly-once).
    fenced: Vec<String>,
    /// Input partitions paused while their task holds [`input::PAUSE_AT`] of their records.
    paused: Vec<(String, i32)>,
    /// Tasks gained and not yet running.
    jobs: Vec<RestoreJob>,
    /// The threads keeping the global tables up to date (started with the first loop).
    globals: Option<GlobalThreads>,
    /// When the tasks were last dropped (or the worker started): under the operator, tasks
    /// are taken again only from an assignment the API server acknowledged with a report
    /// sent after this ([`crate::status::Lease::confirmed_since`]), never from a cached one.
    dropped_at: Instant,
    /// At-least-once hand-offs past their timeout, and the holders said so in the log.
    waiting_for: Vec<(i64, Vec<String>)>,
    /// When idle tasks last marked their stores caught up ([`MARK_CAUGHT_UP_EVERY`]).
    caught_up_marked: Instant,
}

impl Manager<'_> {
    /// Run the loop; on a recoverable error drop the uncommitted work, wait, and go again.
    fn supervise(&mut self) -> Result<(), RuntimeError> {
        loop {
            let err = match self.run_loop() {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if !err.is_recoverable() || self.status.shutdown.load(Ordering::Relaxed) {
                return Err(err);
            }
            if err.is_record_rejection() {
                self.rejections += 1;
                if self.rejections >= MAX_REJECTIONS {
                    return Err(err);
                }
            }
            let reason = err.reason();
            let wait = self.backoff.next().unwrap_or(MAX_BACKOFF);
            tracing::warn!(error = %err, retry_in = ?wait,
                "dropping uncommitted work and resuming from the last commit");
            self.metrics
                .recoveries
                .get_or_create(&ReasonLabels {
                    reason: format!("{reason:?}"),
                })
                .inc();
            self.set_problem(reason, &err);
            self.recover();
            let until = Instant::now() + wait;
            while Instant::now() < until && !self.status.shutdown.load(Ordering::Relaxed) {
                self.status.beat();
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Close every task dirty: its uncommitted cache and the open transaction are dropped,
    /// its store still holds the last commit. The producer goes too (it may be fenced or
    /// hold records that will be produced again), and what Kafka said about the topics.
    fn recover(&mut self) {
        self.status.ready.store(false, Ordering::Relaxed);
        if let Some(p) = self.producer.take() {
            if self.in_transaction {
                let _ = p.abort_transaction(Duration::from_secs(5));
            } else {
                // Nothing queued goes out after this: the work is redone from the last commit,
                // perhaps by another worker.
                p.purge(PurgeConfig::default().queue());
            }
        }
        self.in_transaction = false;
        // The assignment cached may be what made this worker a zombie (its tasks moved while
        // it was cut off or frozen): it takes tasks again only from one read back after now.
        self.dropped_at = Instant::now();
        self.status.lease.reset();
        for j in std::mem::take(&mut self.jobs) {
            j.cancel();
        }
        for t in std::mem::take(&mut self.tasks) {
            t.close_dirty();
        }
        // A global table whose thread stopped starts again from its checkpoints, with the
        // others.
        if self.globals.as_ref().is_some_and(|g| !g.running())
            && let Some(g) = self.globals.take()
        {
            self.status.queries.withdraw_global();
            g.stop();
        }
        // A new consumer too: after every broker went away, librdkafka's consumer can stay
        // unable to reach the group coordinator for good (offset fetches time out forever).
        match input_consumer(self.cfg, &self.metrics) {
            Ok(c) => {
                // Closing the old one waits for its pending commits, which may never end.
                let old = std::mem::replace(&mut self.consumer, c);
                std::thread::spawn(move || drop(old));
                self.paused.clear();
            }
            Err(e) => tracing::warn!("re-creating the consumer: {e}"),
        }
        self.topics = None;
        self.stale = true;
        self.report();
        self.status.confirm_soon();
    }

    /// Record why the worker waits (status report, `/readyz`); cleared by [`Self::healthy`].
    fn set_problem(&self, reason: WorkerProblemReason, err: &RuntimeError) {
        if let Ok(mut p) = self.status.problem.lock() {
            let since = p
                .as_ref()
                .filter(|p| p.reason == reason)
                .and_then(|p| p.since.clone())
                .or_else(|| Some(k8s_openapi::jiff::Timestamp::now().to_string()));
            *p = Some(WorkerProblem {
                reason,
                message: format!("{err}"),
                since,
            });
        }
    }

    /// Work went through: forget past problems.
    fn healthy(&mut self) {
        self.backoff = recovery_backoff();
        self.rejections = 0;
        let cleared = self
            .status
            .problem
            .lock()
            .is_ok_and(|mut p| p.take().is_some());
        if cleared {
            tracing::info!("recovered: processing again");
            self.report();
        }
    }

    /// What Kafka says about the app's topics, and the producer: asked once per (re)start.
    fn ensure_started(&mut self) -> Result<(Arc<Topics>, Arc<collector::Producer>), RuntimeError> {
        let topics = match &self.topics {
            Some(t) => t.clone(),
            None => {
                let t = Arc::new(changelog::prepare(self.cfg)?);
                self.status.queries.set_partitions(&t.partitions);
                self.topics = Some(t.clone());
                t
            }
        };
        let producer = match &self.producer {
            Some(p) => p.clone(),
            None => {
                // Under exactly-once the producer is transactional with an id that names
                // this worker: initializing it fences this worker's previous incarnation
                // and aborts its open transaction, so restore sees the changelogs'
                // committed ends (Kafka Streams' exactly_once_v2: one transaction per
                // thread, not per task).
                let p = if self.cfg.exactly_once() {
                    init_transactions(
                        self.cfg,
                        &collector::transactional_id(
                            &self.cfg.application_id,
                            &self.cfg.instance_id,
                        ),
                        topics.batch_bytes(),
                    )?
                } else {
                    let timeout = self.leased().then_some(collector::LEASED_MESSAGE_TIMEOUT);
                    collector::producer(self.cfg, None, topics.batch_bytes(), timeout)
                        .map_err(kafka("creating the producer"))?
                };
                self.producer = Some(p.clone());
                p
            }
        };
        Ok((topics, producer))
    }

    fn run_loop(&mut self) -> Result<(), RuntimeError> {
        let mut route = Router::new(&self.tasks);
        let mut next_commit = Instant::now() + self.cfg.commit_interval;
        while !self.status.shutdown.load(Ordering::Relaxed) {
            self.status.beat();
            self.ensure_started()?;
            if !self.globals_ready()? {
                // Kafka Streams too starts no task before its global tables are restored.
                self.report();
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            if self.leased() && !(self.tasks.is_empty() && self.jobs.is_empty()) {
                self.status.lease.check()?;
            }
            if let Some(desired) = self.wanted() {
                self.change(&desired)?;
                route = Router::new(&self.tasks);
                self.report();
            }
            if self.progress()? {
                route = Router::new(&self.tasks);
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
                let msg = match msg {
                    Ok(m) => m,
                    Err(e) if fault::is_fatal(&e) => return Err(kafka("consuming")(e)),
                    Err(e) => {
                        // librdkafka reconnects and refetches by itself (a broker restarting,
                        // a leader moving): the assigned partitions resume when it can.
                        self.poll_warning(&e);
                        break;
                    }
                };
                let Some((ti, input)) = route.task(msg.topic(), msg.partition()) else {
                    continue;
                };
                let origin = Origin {
                    topic: msg.topic(),
                    partition: msg.partition(),
                    offset: msg.offset(),
                    key: msg.key(),
                    value: msg.payload(),
                };
                let ts = msg.timestamp().to_millis().unwrap_or(-1);
                if self.tasks[ti].buffers() {
                    self.tasks[ti].buffer(input, &origin, ts);
                    let consumer = &self.consumer;
                    let partition = self.tasks[ti].id.partition;
                    self.tasks[ti]
                        .process_buffered(|i| position(consumer, &i.topic, partition, i.fetched))?;
                } else {
                    self.tasks[ti].process(input, &origin, ts)?;
                }
                if self.tasks[ti].wants_commit() {
                    next_commit = Instant::now();
                }
                if Instant::now() >= next_commit {
                    break;
                }
            }
            // Buffered records whose wait for another input ended (it reached its end or
            // was idle too long).
            for t in self.tasks.iter_mut().filter(|t| t.buffered() > 0) {
                let consumer = &self.consumer;
                let partition = t.id.partition;
                t.process_buffered(|i| position(consumer, &i.topic, partition, i.fetched))?;
                if t.wants_commit() {
                    next_commit = Instant::now();
                }
            }
            self.pause_full_inputs(&route);
            // A sum of counters, once per poll: the gauge follows the caches between commits.
            self.metrics
                .set_record_cache_bytes(self.tasks.iter().map(Task::cache_bytes).sum());
            let now = crate::record::now_ms();
            for t in self
                .tasks
                .iter_mut()
                .filter(|t| t.state == TaskState::Running)
            {
                t.punctuate_wall_clock(now)?;
            }
            // After a broker restart librdkafka can keep a partition's leader unknown for
            // good (its metadata names a broker it no longer has): only a new consumer, made
            // by a recovery, fetches again.
            let leaderless = self.consumer.context().leaderless_for();
            if leaderless >= LEADERLESS_LIMIT {
                return Err(RuntimeError::Leaderless(leaderless));
            }
            if Instant::now() >= next_commit {
                if self.commit()? {
                    self.healthy();
                }
                next_commit = Instant::now() + self.cfg.commit_interval;
                if self.caught_up_marked.elapsed() >= MARK_CAUGHT_UP_EVERY {
                    for t in &mut self.tasks {
                        t.mark_caught_up()?;
                    }
                    self.caught_up_marked = Instant::now();
                }
            }
        }
        self.commit().map(|_| ())
    }

    /// Pause input partitions whose task holds [`input::PAUSE_AT`] of their records while it
    /// waits for another input, and resume those it has processed half of (or no longer
    /// has): the buffers stay small however long the wait (Kafka Streams'
    /// `buffered.records.per.partition`).
    fn pause_full_inputs(&mut self, route: &Router) {
        let tpl = |parts: &[(String, i32)]| {
            let mut tpl = TopicPartitionList::new();
            for (t, p) in parts {
                tpl.add_partition(t, *p);
            }
            tpl
        };
        let full: Vec<(String, i32)> = self
            .tasks
            .iter()
            .flat_map(|t| {
                t.inputs
                    .iter()
                    .filter(|i| i.buffered() >= input::PAUSE_AT)
                    .map(|i| (i.topic.clone(), t.id.partition))
            })
            .filter(|f| !self.paused.contains(f))
            .collect();
        if !full.is_empty() {
            if let Err(e) = self.consumer.pause(&tpl(&full)) {
                tracing::warn!("pausing full inputs: {e}");
            }
            self.paused.extend(full);
        }
        let tasks = &self.tasks;
        let (resume, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.paused)
            .into_iter()
            .partition(|(t, p)| {
                route
                    .task(t, *p)
                    .is_none_or(|(ti, i)| tasks[ti].inputs[i].buffered() <= input::PAUSE_AT / 2)
            });
        self.paused = keep;
        if !resume.is_empty()
            && let Err(e) = self.consumer.resume(&tpl(&resume))
        {
            tracing::warn!("resuming inputs: {e}");
        }
    }

    /// The global tables are restored (their threads start on the first call): tasks are
    /// created and process only then.
    fn globals_ready(&mut self) -> Result<bool, RuntimeError> {
        let tables = &self.cfg.topology.globals;
        if tables.is_empty() {
            return Ok(true);
        }
        match &mut self.globals {
            None => {
                self.globals = Some(GlobalThreads::start(
                    self.cfg,
                    tables,
                    &self.resources,
                    self.metrics.clone(),
                )?);
                Ok(false)
            }
            Some(g) => {
                g.check()?;
                let backlog = g.backlog();
                if let Ok(mut r) = self.status.report.lock() {
                    r.global_backlog = backlog;
                }
                let restored = g.restored();
                if restored && !g.queryable {
                    // Queries read a global table once it has caught up, not half-restored.
                    self.status.queries.set_global(&g.stores);
                    g.queryable = true;
                }
                Ok(restored)
            }
        }
    }

    /// Every task of the app, as (sub-topology index, id). Empty until Kafka told the
    /// partition counts; the loop asks before it needs them.
    fn all_tasks(&self) -> Vec<TaskId> {
        let Some(topics) = &self.topics else {
            return Vec::new();
        };
        self.cfg
            .topology
            .subtopologies
            .iter()
            .flat_map(|s| {
                (0..topics
                    .partitions
                    .get(&s.source().topic)
                    .copied()
                    .unwrap_or(0))
                    .map(move |p| TaskId::new(s.id, p))
            })
            .collect()
    }

    fn poll_warning(&mut self, e: &KafkaError) {
        if self
            .last_poll_warning
            .is_none_or(|t| t.elapsed() > Duration::from_secs(10))
        {
            tracing::warn!(
                "consuming: {e} (librdkafka retries; processing resumes when Kafka answers)"
            );
            self.last_poll_warning = Some(Instant::now());
        }
    }

    /// The assignment to switch to, if it changed (or a recovery dropped the tasks).
    fn wanted(&self) -> Option<Desired> {
        if !self.status.follow_assignment {
            return (self.applied.is_none() || self.stale).then(|| Desired {
                active: self.all_tasks(),
                ..Default::default()
            });
        }
        if !self.status.lease.confirmed_since(self.dropped_at) {
            // Started, or dropped its tasks: wait until a report sent since is acknowledged,
            // which also brings the assignment as of then (taken in before the report is
            // confirmed, so read after this check).
            return None;
        }
        let mut desired = self.status.desired.lock().ok()?.clone()?;
        if Some(desired.generation) == self.applied && !self.stale {
            return None;
        }
        let unknown = desired.retain_known(&self.all_tasks());
        if !unknown.is_empty() {
            tracing::warn!(?unknown, "ignoring assigned tasks this app does not have");
        }
        if self.status.stopping.load(Ordering::Relaxed) {
            // Handing over before it stops: it keeps what it runs until the operator moves it
            // and takes nothing new (an assignment made before the operator saw the pod go).
            let held = self.active_ids();
            desired.active.retain(|t| held.contains(t));
        }
        Some(desired)
    }

    /// The active tasks held now: running, or restoring before they run.
    fn active_ids(&self) -> Vec<TaskId> {
        self.tasks
            .iter()
            .map(|t| t.id)
            .chain(self.jobs.iter().flat_map(|j| j.ids.iter().copied()))
            .collect()
    }

    /// The standby and warm-up tasks followed now.
    fn replicas(&self) -> Vec<TaskId> {
        self.updater
            .as_ref()
            .map(|u| u.replicas.iter().map(|(t, _)| *t).collect())
            .unwrap_or_default()
    }

    /// Apply an assignment: let go of the active tasks not active here any more (committed,
    /// closed; those that stay as standbys go to the state updater with their stores), hand
    /// the replicas to the updater, report, and then take the new active tasks: promoted
    /// standbys restore only the tail their stores lack.
    fn change(&mut self, d: &Desired) -> Result<(), RuntimeError> {
        if self.tasks.is_empty() && self.jobs.is_empty() {
            // Nothing held, so nothing was written since the last drop: a lapse since then
            // (a failover seen while idle) does not stop what this generation gives.
            self.status.lease.reset();
        }
        // Reported as applied once the released tasks are let go (below), before any
        // restore: a worker waiting for them must not wait for this worker's restores.
        self.applied = Some(d.generation);
        self.stale = false;
        // A restore still wanted goes on; one with a task no longer active here is dropped
        // (what it wrote is checkpointed: taking the task again resumes from there).
        let (mut keep, cancel): (Vec<RestoreJob>, Vec<RestoreJob>) = std::mem::take(&mut self.jobs)
            .into_iter()
            .partition(|j| j.ids.iter().all(|t| d.active.contains(t)));
        // A task still waiting for its previous owner waits by the new generation's terms:
        // that owner may since have been failed over (`down`), or left the assignment.
        let mut waiting: Vec<TaskId> = Vec::new();
        for j in keep.iter_mut().filter(|j| !j.started) {
            if j.generation != d.generation {
                // Peers get the hand-off timeout from the generation they are waited on for.
                j.deadline = Instant::now() + HANDOFF_TIMEOUT;
            }
            j.generation = d.generation;
            j.down.clone_from(&d.down);
            j.pods.clone_from(&d.pods);
            waiting.extend(&j.ids);
        }
        self.jobs = keep;
        let jobs = &self.jobs;
        self.waiting_for
            .retain(|(g, _)| jobs.iter().any(|j| j.generation == *g));
        if self.status.follow_assignment && !waiting.is_empty() {
            // Not waited for any more, so fenced first (exactly-once).
            self.fence_down(d, &waiting)?;
        }
        for j in cancel {
            j.cancel();
        }
        let active = self.active_ids();
        let c = plan::changes(&active, &self.replicas(), d);
        if !c.actives_unchanged() {
            tracing::info!(generation = d.generation, start = ?c.start, promote = ?c.promote,
                demote = ?c.demote, release = ?c.release, "applying the assignment");
            // Released tasks hand over committed state, and an open transaction must not
            // outlive `transaction.timeout.ms` during a long restore: commit everything first.
            self.commit()?;
        }
        let lost = c.lost();
        let mut given = MemoryStores::new();
        if !lost.is_empty() {
            let (release, keep): (Vec<Task>, Vec<Task>) = std::mem::take(&mut self.tasks)
                .into_iter()
                .partition(|t| lost.contains(&t.id));
            self.tasks = keep;
            // Committed above and never processed here again: tell the other workers now,
            // before the stores are flushed and closed one by one, so that a new owner starts
            // restoring at once (what it restores is in the changelogs already).
            self.report();
            self.status.report_soon();
            let mut tpl = TopicPartitionList::new();
            for mut t in release {
                for i in &t.inputs {
                    tpl.add_partition(&i.topic, t.id.partition);
                }
                t.close()?;
                t.forget_metrics();
                if c.demote.contains(&t.id) {
                    given.insert(t.id, t.take_memory_stores());
                    tracing::info!(task = %t.id, "task demoted: its stores go on as a standby");
                } else {
                    tracing::info!(task = %t.id, "task released");
                }
                // Dropped here: its database is closed before the updater opens it.
            }
            self.consumer
                .incremental_unassign(&tpl)
                .map_err(kafka("unassigning released partitions"))?;
        }
        let mut handed = MemoryStores::new();
        if c.replicas.is_empty() && self.updater.is_none() {
            // Nothing to follow, nothing followed.
        } else if self.updater.as_ref().map(|u| &u.replicas) != Some(&c.replicas)
            || !given.is_empty()
        {
            if self.updater.is_none() {
                self.updater = Some(
                    Updater::start(
                        self.cfg,
                        self.resources.clone(),
                        self.metrics.clone(),
                        self.status.clone(),
                    )
                    .map_err(RuntimeError::Updater)?,
                );
            }
            if let Some(u) = &mut self.updater {
                let status = &self.status;
                handed = u
                    .set(&c.replicas, given, || status.beat())
                    .map_err(RuntimeError::Updater)?;
            }
        }
        // Tell the other workers at once: one may be waiting to take the released tasks.
        self.report();
        self.status.report_soon();
        let new = c.gained();
        if new.is_empty() {
            self.healthy();
            // Every active task runs (a pod with no task, or only standbys, is Ready too).
            self.status
                .ready
                .store(self.jobs.is_empty(), Ordering::Relaxed);
            return Ok(());
        }
        self.status.ready.store(false, Ordering::Relaxed);
        if self.status.follow_assignment {
            self.fence_down(d, &new)?;
        }
        tracing::info!(tasks = ?new, "taking tasks: restoring them while the running ones go on");
        self.jobs.push(RestoreJob {
            ids: new,
            generation: d.generation,
            down: d.down.clone(),
            pods: d.pods.clone(),
            deadline: Instant::now() + HANDOFF_TIMEOUT,
            handed,
            cancel: Arc::new(AtomicBool::new(false)),
            started: false,
            thread: None,
            committed: None,
        });
        Ok(())
    }

    /// Move the restores along without blocking: a task whose previous owner let go is
    /// created and restored on a thread of its own; a restored task gets its input partition
    /// at its committed offset and runs. True when tasks started running.
    fn progress(&mut self) -> Result<bool, RuntimeError> {
        if self.status.shutdown.load(Ordering::Relaxed) {
            return Ok(false);
        }
        let mut started = false;
        let mut i = 0;
        while i < self.jobs.len() {
            if self.jobs[i].thread.is_none() {
                if self.status.follow_assignment && !self.released(i)? {
                    i += 1;
                    continue;
                }
                self.spawn_restore(i)?;
                i += 1;
                continue;
            }
            if !self.jobs[i]
                .thread
                .as_ref()
                .is_some_and(|t| t.is_finished())
            {
                i += 1;
                continue;
            }
            let mut job = self.jobs.remove(i);
            let (Some(thread), Some(committed)) = (job.thread.take(), job.committed.take()) else {
                continue;
            };
            let (added, result) = thread
                .join()
                .map_err(|_| RuntimeError::Restore(RestoreError::Interrupted))?;
            let restored = result?;
            if let Ok(mut r) = self.status.restored.lock() {
                *r = restored;
            }
            self.run_restored(added, committed)?;
            started = true;
        }
        if started {
            self.stale = false;
            self.healthy();
            let ready = self.jobs.is_empty();
            self.status.ready.store(ready, Ordering::Relaxed);
            // Not urgent: the report that showed the backlog stays up for the reporter's
            // interval, so the operator sees the restore even when it was short.
            self.report();
            if ready {
                tracing::info!(tasks = self.tasks.len(), "all tasks running");
            }
        }
        Ok(started)
    }

    /// Create a job's tasks and restore them on a thread of their own.
    fn spawn_restore(&mut self, i: usize) -> Result<(), RuntimeError> {
        let (topics, producer) = self.ensure_started()?;
        let ids = self.jobs[i].ids.clone();
        let mut added = self.create(&ids, &topics, &producer)?;
        for t in &mut added {
            if let Some(memory) = self.jobs[i].handed.remove(&t.id) {
                t.give_memory_stores(memory);
            }
        }
        // The committed offsets are read before the changelogs: every changelog write of a
        // record below them was flushed before they were committed, so the restore has it
        // even if a previous owner was still committing when the tasks were taken. On a fresh
        // cluster the group coordinator may still be loading: retry those answers.
        let mut tpl = TopicPartitionList::new();
        for t in &added {
            for i in &t.inputs {
                tpl.add_partition(&i.topic, t.id.partition);
            }
        }
        let committed = retry(Duration::from_secs(60), || {
            self.consumer
                .committed_offsets(tpl.clone(), Duration::from_secs(30))
        })
        .map_err(kafka(if self.cfg.exactly_once() {
            // Read-committed reads wait while a transaction holds the offsets; one that never
            // ends is a broker fault the operator has to clear.
            "reading committed offsets (they wait for any open transaction on them: if this \
             repeats for minutes, see \"A transaction left hanging\" in docs/operations.md)"
        } else {
            "reading committed offsets"
        }))?;
        self.jobs[i].committed = Some(committed);
        let cfg = self.cfg.clone();
        let (metrics, status) = (self.metrics.clone(), self.status.clone());
        let cancel = self.jobs[i].cancel.clone();
        // Reported as ACTIVE (RESTORING) from now on: the previous owner let go.
        self.jobs[i].started = true;
        self.report();
        let thread = std::thread::Builder::new()
            .name("eddy-restore".into())
            .spawn(move || {
                let result = restore::restore(&cfg, &mut added, &metrics, &status, &cancel);
                (added, result)
            })
            .map_err(|e| RuntimeError::Updater(UpdaterError::Spawn(e)))?;
        self.jobs[i].thread = Some(thread);
        Ok(())
    }

    /// Restored tasks resume their input partitions where the last commit left them
    /// (`committed`, read before their restore began), and run.
    fn run_restored(
        &mut self,
        mut added: Vec<Task>,
        committed: TopicPartitionList,
    ) -> Result<(), RuntimeError> {
        let Some(producer) = self.producer.clone() else {
            return Err(RuntimeError::NoGroupMetadata);
        };
        // Knowing the partition leaders before assigning lets the first fetch go out at once
        // instead of after librdkafka's own metadata refresh (about half a second).
        let mut topics: Vec<&str> = added
            .iter()
            .flat_map(|t| t.inputs.iter().map(|i| i.topic.as_str()))
            .collect();
        topics.sort_unstable();
        topics.dedup();
        for topic in topics {
            self.consumer
                .fetch_metadata(Some(topic), Duration::from_secs(30))
                .map_err(kafka(format!("reading the metadata of {topic}")))?;
        }
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
        if self.cfg.exactly_once() && !self.in_transaction {
            producer
                .begin_transaction()
                .map_err(kafka("beginning a transaction"))?;
            self.in_transaction = true;
        }
        for t in &mut added {
            for e in committed.elements() {
                if let Offset::Offset(o) = e.offset()
                    && e.partition() == t.id.partition
                {
                    t.resume_at(e.topic(), o);
                }
            }
            t.transition(TaskState::Running);
        }
        self.tasks.extend(added);
        Ok(())
    }

    /// Create tasks (not yet restored), all writing through this worker's producer.
    fn create(
        &self,
        ids: &[TaskId],
        topics: &Arc<Topics>,
        producer: &Arc<collector::Producer>,
    ) -> Result<Vec<Task>, RuntimeError> {
        let cfg = self.cfg;
        // The record cache is shared by the tasks that have stores: a stateless task (a
        // filter before a repartition) caches nothing.
        let stateful = |id: &TaskId| {
            cfg.topology
                .subtopologies
                .iter()
                .any(|s| s.id == id.subtopology && !s.stores.is_empty())
        };
        let with_stores = self.tasks.iter().filter(|t| !t.stores.is_empty()).count()
            + ids.iter().filter(|id| stateful(id)).count();
        let cache_share = cfg.record_cache_bytes / with_stores.max(1);
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let Some(sub) = cfg
                .topology
                .subtopologies
                .iter()
                .find(|s| s.id == id.subtopology)
            else {
                continue;
            };
            let mut collector = Collector::new(producer.clone(), topics.clone());
            if self.leased() {
                collector = collector.under(self.status.lease.clone());
            }
            let task = Task::new(
                cfg,
                sub,
                id.partition,
                &self.resources,
                collector,
                cache_share,
                self.metrics.clone(),
            )?;
            out.push(
                task.with_global(self.globals.as_ref().map(|g| g.stores.clone()))
                    .with_queries(self.status.queries.clone()),
            );
        }
        Ok(out)
    }

    /// Commit every task that processed something since the last commit; true if there was
    /// something to commit.
    fn commit(&mut self) -> Result<bool, RuntimeError> {
        let started = Instant::now();
        let leased = self.leased();
        let tasks = &mut self.tasks;
        let dirty: Vec<usize> = (0..tasks.len())
            .filter(|&i| tasks[i].has_uncommitted())
            .collect();
        if dirty.is_empty() {
            return Ok(false);
        }
        let Some(p) = self.producer.clone() else {
            return Ok(false);
        };
        for &i in &dirty {
            tasks[i].flush()?;
        }
        let mut offsets = TopicPartitionList::new();
        for &i in &dirty {
            for input in &tasks[i].inputs {
                if let Some(o) = input.next_offset {
                    offsets
                        .add_partition_offset(
                            &input.topic,
                            tasks[i].id.partition,
                            Offset::Offset(o),
                        )
                        .map_err(kafka("building offsets"))?;
                }
            }
        }
        collector::flush(&p, Duration::from_secs(60)).map_err(kafka("waiting for deliveries"))?;
        // Every output of the records being committed must be acknowledged before their
        // input offsets are: a record the broker did not take is never committed past.
        if let Some(e) = collector::take_delivery_error(&p) {
            return Err(RuntimeError::Delivery(e));
        }
        if self.cfg.exactly_once() {
            // One transaction for every task: their outputs, changelog records and input
            // offsets become visible together or not at all.
            if offsets.count() > 0 {
                let group = self
                    .consumer
                    .group_metadata()
                    .ok_or(RuntimeError::NoGroupMetadata)?;
                p.send_offsets_to_transaction(&offsets, &group, Duration::from_secs(30))
                    .map_err(kafka("sending input offsets to the transaction"))?;
            }
            p.commit_transaction(Duration::from_secs(60))
                .map_err(kafka("committing the transaction"))?;
            self.in_transaction = false;
            p.begin_transaction()
                .map_err(kafka("beginning a transaction"))?;
            self.in_transaction = true;
        } else if offsets.count() > 0 {
            if leased {
                // Another worker may own these tasks once the lease lapsed: its offsets win.
                self.status.lease.check()?;
            }
            commit_offsets(&self.consumer, offsets)?;
        }
        for &i in &dirty {
            tasks[i].write_committed()?;
        }
        self.metrics.commits.inc();
        self.metrics
            .commit_seconds
            .observe(started.elapsed().as_secs_f64());
        Ok(true)
    }

    /// Under the operator, a task moving here is restored only after its previous owner
    /// committed it and let it go ([`Self::released`], checked on every turn of the loop): no
    /// other worker reports it ACTIVE any more. Pods the operator failed over (`down`) are not
    /// waited for; under exactly-once they are fenced at once, unless back on this generation
    /// without the `gained` tasks ([`plan::to_fence`]). A worker that does not let go in time
    /// (hung, cut off from the API server) is fenced under exactly-once: initializing its
    /// transactional id aborts its open transaction and makes its next commit fail.
    /// At-least-once has nothing to fence with: the task waits for that worker to let go, or
    /// for the operator to fail it over once its lease has lapsed ([`Self::released`]).
    fn fence_down(&mut self, d: &Desired, gained: &[TaskId]) -> Result<(), RuntimeError> {
        self.fenced.retain(|p| d.down.contains(p));
        if !self.cfg.exactly_once() {
            return Ok(());
        }
        let fence = match self.status.peers.lock() {
            Ok(peers) => {
                plan::to_fence(&peers, gained, &d.down, d.generation, &self.cfg.instance_id)
            }
            // No view of the peers: fence every failed-over pod, as a previous owner may be
            // among them.
            Err(_) => d
                .down
                .iter()
                .filter(|p| **p != self.cfg.instance_id)
                .cloned()
                .collect(),
        };
        for pod in fence {
            if self.fenced.contains(&pod) {
                continue;
            }
            let id = collector::transactional_id(&self.cfg.application_id, &pod);
            tracing::warn!(worker = %pod, transactional_id = %id,
                "the operator failed this worker over: fencing it before taking its tasks");
            init_transactions(self.cfg, &id, None)?;
            self.fenced.push(pod);
        }
        Ok(())
    }

    /// True once no peer outside `down` may hold one of job `i`'s tasks ([`plan::holders`]: it
    /// reports one ACTIVE, or has not applied the job's generation), or, under exactly-once,
    /// once the hand-off timeout passed and those peers are fenced. Under at-least-once only
    /// the peers themselves (letting go) or the operator (failing them over) end the wait.
    fn released(&mut self, i: usize) -> Result<bool, RuntimeError> {
        let job = &self.jobs[i];
        let holders = match self.status.peers.lock() {
            Ok(peers) => plan::holders(&peers, &job.ids, &job.down, job.generation, &job.pods),
            Err(_) => Vec::new(),
        };
        if holders.is_empty() {
            return Ok(true);
        }
        if Instant::now() < job.deadline {
            return Ok(false);
        }
        if !self.cfg.exactly_once() {
            // Nothing can fence an at-least-once writer: wait for it to let go, or for the
            // operator to fail it over once its lease has surely lapsed.
            let said = (job.generation, holders.clone());
            if !self.waiting_for.contains(&said) {
                tracing::warn!(workers = ?holders, generation = job.generation, timeout_s = HANDOFF_TIMEOUT.as_secs(),
                    "workers still hold tasks assigned here, or have not applied their generation: waiting for them to let go, or for the operator to fail them over (at-least-once cannot fence a writer)");
                self.waiting_for.push(said);
            }
            return Ok(false);
        }
        for pod in holders {
            let id = collector::transactional_id(&self.cfg.application_id, &pod);
            tracing::warn!(worker = %pod, transactional_id = %id, timeout_s = HANDOFF_TIMEOUT.as_secs(),
                "a worker still holds tasks assigned here, or has not applied their generation: fencing it");
            init_transactions(self.cfg, &id, None)?;
        }
        Ok(true)
    }

    /// Under at-least-once with the operator, writes need the worker's lease
    /// ([`crate::status::Lease`]): Kafka cannot fence a second writer of a task.
    fn leased(&self) -> bool {
        self.status.follow_assignment && !self.cfg.exactly_once()
    }

    fn report(&self) {
        let problem = self.status.problem.lock().ok().and_then(|p| p.clone());
        let Ok(mut r) = self.status.report.lock() else {
            return;
        };
        // Read by this thread with the tasks below: once `stopping` is reported, the task list
        // beside it is all this worker will ever hold ([`Runtime::wanted`]).
        r.stopping = self.status.stopping.load(Ordering::Relaxed);
        r.problem = problem;
        r.applied_generation = self.applied.unwrap_or(0);
        if self.leased() && self.tasks.is_empty() && self.jobs.is_empty() {
            // Holding nothing, and taking tasks only from a newer assignment (they only move
            // forward): this worker is no one's holder as of the latest generation it has
            // seen, even while it cannot apply it (global tables restoring, Kafka away).
            // At-least-once waits for such peers without a timeout (nothing can fence them).
            let seen = self
                .status
                .desired
                .lock()
                .ok()
                .and_then(|d| d.as_ref().map(|d| d.generation));
            r.applied_generation = r.applied_generation.max(seen.unwrap_or(0));
        }
        let mut tasks: std::collections::BTreeMap<String, TaskStatus> = self
            .tasks
            .iter()
            .map(|t| {
                (
                    t.id.to_string(),
                    TaskStatus {
                        role: TaskRole::Active,
                        state: t.state,
                        restore_backlog: 0,
                        // Running: it writes the changelogs.
                        lag: (t.state == TaskState::Running).then_some(0),
                    },
                )
            })
            .collect();
        // Tasks restoring on their thread: restore keeps their backlog up to date.
        for id in self.jobs.iter().filter(|j| j.started).flat_map(|j| &j.ids) {
            let key = id.to_string();
            let entry = r.tasks.get(&key).cloned().unwrap_or(TaskStatus {
                role: TaskRole::Active,
                state: TaskState::Restoring,
                restore_backlog: 0,
                lag: None,
            });
            tasks.insert(key, entry);
        }
        r.tasks = tasks;
    }
}

/// Tasks gained in one generation: waiting for their previous owner to let go, then
/// restoring on a thread of their own while the processing thread goes on.
struct RestoreJob {
    ids: Vec<TaskId>,
    /// The generation that gave the tasks here.
    generation: i64,
    /// The assignment's failed-over pods: not waited for.
    down: Vec<String>,
    /// The assignment's pods: each is waited for until it applied `generation`.
    pods: Vec<String>,
    /// When the previous owner is fenced (exactly-once) or ignored (at-least-once).
    deadline: Instant,
    /// In-memory stores of promoted standbys, for the tasks when they are created.
    handed: MemoryStores,
    cancel: Arc<AtomicBool>,
    /// The previous owner let go: the tasks exist and restore.
    started: bool,
    /// The restoring thread, which hands the tasks back with the outcome.
    thread: Option<RestoreThread>,
    /// The input offsets committed when the restore began, where the tasks resume.
    committed: Option<TopicPartitionList>,
}

type RestoreThread = std::thread::JoinHandle<(Vec<Task>, Result<Restored, RestoreError>)>;

impl RestoreJob {
    /// Stop restoring and drop the tasks (their stores keep what was restored), and their
    /// gauges (a cancelled restore's backlog would stay up for good).
    fn cancel(self) {
        self.cancel.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread
            && let Ok((tasks, _)) = t.join()
        {
            tasks.iter().for_each(Task::forget_metrics);
        }
    }
}

/// A producer with transactional id `id`, initialized: this fences every earlier producer
/// with that id and aborts its open transaction.
fn init_transactions(
    cfg: &WorkerConfig,
    id: &str,
    batch_bytes: Option<usize>,
) -> Result<Arc<collector::Producer>, RuntimeError> {
    let p = collector::producer(cfg, Some(id), batch_bytes, None)
        .map_err(kafka(format!("producer {id}")))?;
    retry(Duration::from_secs(60), || {
        p.init_transactions(Duration::from_secs(60))
    })
    .map_err(kafka(format!("initializing transactions of {id}")))?;
    Ok(p)
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

/// Commit input offsets (at-least-once), waiting at most [`COMMIT_TIMEOUT`] for the answer.
/// librdkafka's synchronous commit has no timeout, and after a broker restart its group
/// coordinator lookup can stay stuck for good; the commit then runs on a thread of its own,
/// left behind if it never returns, and the worker recovers with a new consumer.
fn commit_offsets(
    consumer: &Arc<BaseConsumer<LagReporter>>,
    offsets: TopicPartitionList,
) -> Result<(), RuntimeError> {
    let (tx, rx) = std::sync::mpsc::channel();
    let c = consumer.clone();
    std::thread::spawn(move || {
        let _ = tx.send(c.commit(&offsets, CommitMode::Sync));
    });
    match rx.recv_timeout(COMMIT_TIMEOUT) {
        Ok(r) => r.map_err(kafka("committing offsets")),
        Err(_) => Err(RuntimeError::CommitStalled(COMMIT_TIMEOUT)),
    }
}

/// Where an input stands: at its end when what was fetched (`fetched`: the offset after the
/// last record fetched, or where the task resumed; else the log start, where a task without
/// a committed offset begins) reaches the partition's high watermark. Short of it, the rest
/// may hold no record when it is a single offset, or librdkafka's fetcher read past it all
/// (transaction markers, aborted records; its statistics say so, up to 5 s late).
fn position(
    consumer: &BaseConsumer<LagReporter>,
    topic: &str,
    partition: i32,
    fetched: Option<i64>,
) -> Position {
    let Some((low, high)) = watermarks(consumer, topic, partition) else {
        return Position::Unknown;
    };
    let Some(f) = fetched.or(low) else {
        return Position::Behind;
    };
    if f >= high {
        Position::AtEnd
    } else if f + 1 == high
        || consumer
            .context()
            .fetched_past(topic, partition)
            .is_some_and(|past| past >= high)
    {
        Position::MaybeNoRecord
    } else {
        Position::Behind
    }
}

/// How often a running task marks its stores caught up with their changelogs even when it
/// committed nothing: a task idle for longer than its changelogs keep tombstones (a day by
/// default, less a margin of up to an hour) would otherwise be rebuilt in full after a crash.
const MARK_CAUGHT_UP_EVERY: Duration = Duration::from_secs(600);

/// Longer than a leader election takes, shorter than anyone waits for a stalled partition.
const LEADERLESS_LIMIT: Duration = Duration::from_secs(30);

/// Longer than librdkafka's own retries of a commit to a coordinator that moves.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a worker waits for the previous owner of a task to let it go before fencing it,
/// under exactly-once (a worker reports at once when it lets tasks go, and at least every
/// 5 s); under at-least-once it only says so in the log and goes on waiting.
const HANDOFF_TIMEOUT: Duration = Duration::from_secs(15);

/// Partition → (index of the task reading it, index of the input it is to that task).
type Readers = HashMap<i32, (usize, usize)>;

/// Maps an input (topic, partition) to the task that owns it and which of its inputs it is.
struct Router {
    topics: Vec<(String, Readers)>,
}

impl Router {
    fn new(tasks: &[Task]) -> Self {
        let mut topics: Vec<(String, Readers)> = Vec::new();
        for (i, t) in tasks.iter().enumerate() {
            for (j, input) in t.inputs.iter().enumerate() {
                let at = (t.id.partition, (i, j));
                match topics.iter_mut().find(|(n, _)| *n == input.topic) {
                    Some((_, m)) => {
                        m.insert(at.0, at.1);
                    }
                    None => topics.push((input.topic.clone(), HashMap::from([at]))),
                }
            }
        }
        Self { topics }
    }

    fn task(&self, topic: &str, partition: i32) -> Option<(usize, usize)> {
        self.topics
            .iter()
            .find(|(n, _)| n == topic)
            .and_then(|(_, m)| m.get(&partition).copied())
    }
}

/// The low (if known) and high watermarks librdkafka last heard of for a partition (no
/// request: they come with every fetch response), if it has heard one.
fn watermarks<C: rdkafka::consumer::ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partition: i32,
) -> Option<(Option<i64>, i64)> {
    let topic = std::ffi::CString::new(topic).ok()?;
    let (mut low, mut high) = (-1i64, -1i64);
    // SAFETY: the client pointer is valid while `consumer` lives; librdkafka copies nothing
    // from `topic` past the call and writes only the two offsets.
    let err = unsafe {
        rdkafka::bindings::rd_kafka_get_watermark_offsets(
            consumer.client().native_ptr(),
            topic.as_ptr(),
            partition,
            &mut low,
            &mut high,
        )
    };
    (err == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0)
        .then_some(((low >= 0).then_some(low), high))
}

#[cfg(test)]
mod tests {
    use super::{MAX_BACKOFF, MIN_BACKOFF, input_lag, recovery_backoff};
    use rdkafka::statistics::Partition;
    use std::time::Duration;

    /// Waits double from 200 ms to 10 s, each with up to as much again at random: two
    /// workers failing at once wait different times.
    #[test]
    fn recoveries_back_off_with_jitter() {
        let waits: Vec<Duration> = recovery_backoff().take(12).collect();
        assert_eq!(waits.len(), 12, "the back-off never runs out");
        let mut bound = MIN_BACKOFF;
        for w in &waits {
            assert!(
                *w >= bound && *w <= bound * 2,
                "{w:?} not in [{bound:?}, {:?}]",
                bound * 2
            );
            bound = (bound * 2).min(MAX_BACKOFF);
        }
        let others: Vec<Duration> = recovery_backoff().take(12).collect();
        assert_ne!(waits, others, "two workers' waits are the same");
    }

    #[test]
    fn input_lag_counts_from_the_position_not_a_commit() {
        let p = |fetchq_cnt, next_offset, app_offset, ls_offset| Partition {
            fetchq_cnt,
            next_offset,
            app_offset,
            ls_offset,
            hi_offset: ls_offset,
            committed_offset: -1001,
            consumer_lag: -1,
            ..Default::default()
        };
        // Idle after an assignment (nothing consumed yet, nothing committed by this consumer).
        assert_eq!(input_lag(&p(0, 500, -1001, 500)), Some(0));
        // Past a transaction marker: the fetch position is past it, the last record is not.
        assert_eq!(input_lag(&p(0, 501, 499, 501)), Some(0));
        // Records prefetched and not processed yet count.
        assert_eq!(input_lag(&p(200, 900, 700, 1000)), Some(300));
        assert_eq!(input_lag(&p(200, 900, -1001, 1000)), Some(100));
        // Nothing known yet (offset query in flight).
        assert_eq!(input_lag(&p(0, -1001, -1001, 1000)), None);
        assert_eq!(input_lag(&p(0, 10, -1001, -1001)), None);
    }

    #[test]
    fn an_app_with_records_larger_than_a_fetch_response_still_gets_its_consumer() {
        let cfg = |props: &str| {
            let text = format!(
                "applicationId: big\nkafka: {{bootstrapServers: '127.0.0.1:1', properties: {{{props}}}}}\ntopology: [{{from: {{topic: a}}}}]\n"
            );
            crate::config::WorkerConfig::from_text(
                &text,
                std::path::Path::new("app.yaml"),
                crate::config::Overrides::default(),
            )
            .expect("config")
        };
        let metrics = std::sync::Arc::new(crate::metrics::Metrics::new());
        // 20 MB records: librdkafka refuses a fetch.max.bytes below message.max.bytes.
        assert!(super::input_consumer(&cfg("message.max.bytes: '20971520'"), &metrics).is_ok());
        assert!(super::input_consumer(&cfg("message.max.bytes: '1000000'"), &metrics).is_ok());
        assert!(super::INPUT_CONSUMER_TUNING.contains(&(
            "fetch.max.bytes",
            &super::INPUT_FETCH_MAX_BYTES.to_string()[..]
        )));
    }
}
