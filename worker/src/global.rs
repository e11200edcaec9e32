//! Global tables (Kafka Streams' `GlobalKTable`, `GlobalStateManager` and
//! `GlobalStreamThread`): every worker holds every partition of the table's topic in one
//! RocksDB under `<stateDir>/<applicationId>/global/`, with a checkpoint per partition. The
//! topic is the table's changelog: at start each table reads it from its checkpoints to the
//! end, before any task processes, then a thread per table keeps reading it. Tasks look keys
//! up at any time; a global table's updates are not ordered with the stream records.
//!
//! A checkpoint the topic no longer covers, or older than a compacted topic keeps tombstones
//! ([`crate::checkpoint`]), rebuilds the whole table from the topic's beginning. Each
//! partition's checkpoint carries when it was last at the topic's end: when the end read at
//! start was reached, then whenever a new end is reached.

use crate::checkpoint;
use crate::config::WorkerConfig;
use crate::metrics::{Metrics, StoreLabels};
use crate::restore::{RestoreContext, changelog_reader};
use crate::store::{Change, Mark, StateResources, StoreError, TaskDb, partition_checkpoint};
use eddy_crds::Format;
use rdkafka::Offset;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::topic_partition_list::TopicPartitionList;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A table every task can look up by any key.
#[derive(Clone, Debug, PartialEq)]
pub struct GlobalTable {
    /// The table's name in `spec.tables`.
    pub name: String,
    pub store: String,
    pub topic: String,
    pub key_format: Format,
    pub value_format: Format,
}

#[derive(Debug, thiserror::Error)]
pub enum GlobalError {
    /// `table` names the table and its topic.
    #[error("global table {table}: {cause}")]
    Kafka { table: String, cause: KafkaError },
    #[error("global table {table}: topic {topic} has no partitions: does it exist?")]
    NoPartitions { table: String, topic: String },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("starting the thread of a global table: {0}")]
    Spawn(std::io::Error),
    #[error("the thread of global table {0} stopped unexpectedly")]
    Died(String),
}

/// Records written to the store in one batch while catching up.
const BATCH: usize = 10_000;

/// The global tables' stores, shared with every task for lookups.
pub struct GlobalStores {
    db: TaskDb,
}

impl GlobalStores {
    /// The value of `key` in a global table's store.
    pub fn get(&self, store: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.db.get(store, key)
    }

    /// The tables as they are now, for a query.
    pub fn snapshot(&self) -> crate::store::Snapshot<'_> {
        self.db.snapshot()
    }
}

/// The threads that keep the global tables up to date.
pub struct GlobalThreads {
    pub stores: Arc<GlobalStores>,
    /// Tables that have reached the end their topic had when they started.
    caught_up: Arc<AtomicUsize>,
    /// Per table, records left to read before it has caught up.
    backlogs: Arc<Vec<AtomicI64>>,
    stop: Arc<AtomicBool>,
    threads: Vec<(String, JoinHandle<Result<(), GlobalError>>)>,
    /// A thread stopped with an error (and was removed from `threads`).
    failed: bool,
    /// Offered to queries (once every table caught up).
    pub queryable: bool,
}

impl GlobalThreads {
    /// Open the global stores and start a thread per table; [`Self::restored`] says when
    /// every table has caught up.
    pub fn start(
        cfg: &WorkerConfig,
        tables: &[GlobalTable],
        resources: &StateResources,
        metrics: Arc<Metrics>,
    ) -> Result<Self, GlobalError> {
        let path = cfg.state_dir.join(&cfg.application_id).join("global");
        let names: Vec<String> = tables.iter().map(|t| t.store.clone()).collect();
        let (db, reconciled) = TaskDb::open(resources, &path, &names)?;
        for store in reconciled.dropped {
            tracing::info!(%store, "global store no longer in the topology: dropped");
        }
        let stores = Arc::new(GlobalStores { db });
        let caught_up = Arc::new(AtomicUsize::new(0));
        let backlogs: Arc<Vec<AtomicI64>> =
            Arc::new(tables.iter().map(|_| AtomicI64::new(0)).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for (i, t) in tables.iter().enumerate() {
            let (table, cfg) = (t.clone(), cfg.clone());
            let (stores, caught_up, stop) = (stores.clone(), caught_up.clone(), stop.clone());
            let (metrics, backlogs) = (metrics.clone(), backlogs.clone());
            let thread = std::thread::Builder::new()
                .name(format!("eddy-global-{}", t.name))
                .spawn(move || {
                    let shared = Shared {
                        stores: &stores,
                        caught_up: &caught_up,
                        backlog: &backlogs[i],
                        stop: &stop,
                        metrics: &metrics,
                    };
                    let r = follow(&cfg, &table, &shared);
                    if let Err(e) = &r {
                        tracing::error!(table = %table.name, error = %e, "global table stopped");
                    }
                    r
                })
                .map_err(GlobalError::Spawn)?;
            threads.push((t.name.clone(), thread));
        }
        Ok(Self {
            stores,
            caught_up,
            backlogs,
            stop,
            threads,
            failed: false,
            queryable: false,
        })
    }

    /// Records left to read before every table has caught up.
    pub fn backlog(&self) -> i64 {
        self.backlogs
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .sum()
    }

    /// Every table has read its topic to the end it had at start.
    pub fn restored(&self) -> bool {
        self.caught_up.load(Ordering::Acquire) >= self.threads.len()
    }

    /// Every thread still runs.
    pub fn running(&self) -> bool {
        self.threads.iter().all(|(_, t)| !t.is_finished()) && !self.failed
    }

    /// The first error of a thread that stopped, if one did.
    pub fn check(&mut self) -> Result<(), GlobalError> {
        if let Some(i) = self.threads.iter().position(|(_, t)| t.is_finished()) {
            let (name, t) = self.threads.remove(i);
            self.failed = true;
            return match t.join() {
                Ok(Err(e)) => Err(e),
                _ => Err(GlobalError::Died(name)),
            };
        }
        Ok(())
    }

    /// Stop the threads; what they wrote is checkpointed.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for (_, t) in self.threads {
            let _ = t.join();
        }
        if let Err(e) = self.stores.db.flush() {
            tracing::warn!("flushing the global stores: {e}");
        }
    }
}

/// What a table's thread shares with the others and the runtime.
struct Shared<'a> {
    stores: &'a GlobalStores,
    caught_up: &'a AtomicUsize,
    backlog: &'a AtomicI64,
    stop: &'a AtomicBool,
    metrics: &'a Metrics,
}

/// One table: catch up from the checkpoints, then keep reading until stopped.
fn follow(cfg: &WorkerConfig, t: &GlobalTable, sh: &Shared<'_>) -> Result<(), GlobalError> {
    let kafka = |source| GlobalError::Kafka {
        table: format!("{} (topic {})", t.name, t.topic),
        cause: source,
    };
    let consumer = changelog_reader(
        cfg.client_config(),
        format!("{}-global", cfg.application_id),
    )
    .map_err(kafka)?;
    let md = consumer
        .fetch_metadata(Some(&t.topic), Duration::from_secs(30))
        .map_err(kafka)?;
    let partitions: Vec<i32> = md
        .topics()
        .iter()
        .filter(|m| m.name() == t.topic)
        .flat_map(|m| m.partitions().iter().map(|p| p.id()))
        .collect();
    if partitions.is_empty() {
        return Err(GlobalError::NoPartitions {
            table: t.name.clone(),
            topic: t.topic.clone(),
        });
    }
    let tombstones = crate::changelog::tombstone_retention(cfg, &[t.topic.as_str()])
        .map_err(|e| kafka(e.into_kafka()))?
        .get(&t.topic)
        .copied()
        .flatten();
    let db = &sh.stores.db;
    let mut checkpoints = db.partition_checkpoints(&t.store)?;
    let mut marks = HashMap::new();
    // Before the ends are read: an end reached was the end at this time at the latest.
    let read_at = crate::record::now_ms();
    for &p in &partitions {
        let (low, high) = consumer
            .fetch_watermarks(&t.topic, p, Duration::from_secs(30))
            .map_err(kafka)?;
        marks.insert(p, (low, high));
        let Some(c) = db.stored_checkpoint(&partition_checkpoint(&t.store, p))? else {
            continue;
        };
        if let Some(why) = checkpoint::check(c, low, high, tombstones, read_at) {
            // The table's partitions share one store: all of it goes.
            checkpoint::rebuilding(
                sh.metrics,
                &why,
                "global",
                &t.store,
                &t.topic,
                p,
                "the whole global table",
            );
            db.clear_partitioned(&t.store)?;
            checkpoints.clear();
        }
    }
    let mut tpl = TopicPartitionList::new();
    let mut backlog = 0;
    // Partition -> (next offset to read, end to reach).
    let mut positions = HashMap::new();
    // Partitions read from the beginning count as caught up from the start of their read
    // until they reach the end (see `crate::checkpoint`); the others keep their time.
    let from_scratch: HashSet<i32> = marks
        .keys()
        .filter(|p| !checkpoints.contains_key(p))
        .copied()
        .collect();
    for (&p, &(low, high)) in &marks {
        let from = checkpoints.get(&p).copied().unwrap_or(low);
        backlog += (high - from).max(0);
        positions.insert(p, (from, high));
        let offset = checkpoints
            .get(&p)
            .map_or(Offset::Beginning, |&c| Offset::Offset(c));
        tpl.add_partition_offset(&t.topic, p, offset)
            .map_err(kafka)?;
    }
    tracing::info!(table = %t.name, topic = %t.topic, backlog, "restoring global table");
    sh.backlog.store(backlog, Ordering::Relaxed);
    consumer.assign(&tpl).map_err(kafka)?;
    let times = Times {
        read_at,
        from_scratch,
    };
    run(t, sh, &consumer, positions, times)
}

/// The times written with a table's checkpoints (see `follow`).
struct Times {
    /// When the ends to reach at start were read.
    read_at: i64,
    /// Partitions read from the beginning, until each reaches the end.
    from_scratch: HashSet<i32>,
}

/// Read the assigned partitions into the store until stopped; count the table caught up once
/// every partition reached its end.
fn run(
    t: &GlobalTable,
    sh: &Shared<'_>,
    consumer: &BaseConsumer<RestoreContext>,
    mut positions: HashMap<i32, (i64, i64)>,
    mut times: Times,
) -> Result<(), GlobalError> {
    let db = &sh.stores.db;
    let mut open: HashSet<i32> = positions.keys().copied().collect();
    let mut restored = false;
    let started = Instant::now();
    // The last value read per key (a batch writes each key once: `TaskDb::write` leaves out
    // deletes of keys the database lacks, so a put and a delete of one key must not meet in
    // a batch), and the records read into it.
    let mut changes: HashMap<Vec<u8>, Option<Vec<u8>>> = HashMap::new();
    let mut read = 0u64;
    let mut offsets: HashMap<i32, i64> = HashMap::new();
    // Partitions that reached their end since the last write, and when.
    let mut ends_reached: HashMap<i32, i64> = HashMap::new();
    let labels = StoreLabels {
        task: "global".into(),
        store: t.store.clone(),
    };
    let mut last_warning: Option<Instant> = None;
    let remaining = sh.metrics.restore_remaining.get_or_create(&labels).clone();
    while !sh.stop.load(Ordering::Relaxed) {
        let mut idle = false;
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                // As Kafka Streams: a table drops records without a key.
                if let Some(k) = m.key() {
                    changes.insert(k.to_vec(), m.payload().map(<[u8]>::to_vec));
                }
                read += 1;
                offsets.insert(m.partition(), m.offset() + 1);
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                // The first time, the end read at start (or later); after that, a new end
                // just fetched.
                let at = if open.remove(&p) {
                    times.read_at
                } else {
                    crate::record::now_ms()
                };
                times.from_scratch.remove(&p);
                ends_reached.insert(p, at);
                idle = true;
            }
            Some(Err(e)) if crate::fault::is_fatal(&e) => {
                return Err(GlobalError::Kafka {
                    table: format!("{} (topic {})", t.name, t.topic),
                    cause: e,
                });
            }
            Some(Err(e)) => {
                if last_warning.is_none_or(|w| w.elapsed() > Duration::from_secs(10)) {
                    tracing::warn!(table = %t.name, "reading the global table's topic: {e} (librdkafka retries)");
                    last_warning = Some(Instant::now());
                }
                idle = true;
            }
            None => idle = true,
        }
        if changes.len() >= BATCH || (idle && !(offsets.is_empty() && ends_reached.is_empty())) {
            let n = std::mem::take(&mut read);
            let mut names: Vec<(String, Mark)> = offsets
                .drain()
                .map(|(p, o)| {
                    if let Some(pos) = positions.get_mut(&p) {
                        pos.0 = o;
                    }
                    let at = ends_reached
                        .remove(&p)
                        .or_else(|| times.from_scratch.contains(&p).then_some(times.read_at));
                    let mark = Mark {
                        offset: Some(o),
                        caught_up_at: at,
                    };
                    (partition_checkpoint(&t.store, p), mark)
                })
                .collect();
            // At the end with nothing new: only the time moves.
            names.extend(ends_reached.drain().map(|(p, at)| {
                let mark = Mark {
                    offset: None,
                    caught_up_at: Some(at),
                };
                (partition_checkpoint(&t.store, p), mark)
            }));
            db.write(
                changes.iter().map(|(k, v)| {
                    (
                        t.store.as_str(),
                        Change {
                            key: k,
                            value: v.as_deref(),
                        },
                    )
                }),
                names.iter().map(|(n, o)| (n.as_str(), *o)),
            )?;
            changes.clear();
            if !restored {
                sh.metrics.restored_records.get_or_create(&labels).inc_by(n);
                let left: i64 = positions.values().map(|(at, end)| (end - at).max(0)).sum();
                sh.backlog.store(left, Ordering::Relaxed);
                remaining.set(left);
            }
        }
        if !restored && open.is_empty() && offsets.is_empty() {
            restored = true;
            sh.backlog.store(0, Ordering::Relaxed);
            remaining.set(0);
            sh.caught_up.fetch_add(1, Ordering::AcqRel);
            tracing::info!(table = %t.name, seconds = started.elapsed().as_secs_f64(), "global table restored");
        }
    }
    Ok(())
}
