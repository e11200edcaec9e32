//! Restore: before a task processes anything, bring each of its stores up to the end of its
//! changelog, starting from the checkpoint stored with the data, so a restart on the same
//! state directory replays only the tail. A checkpoint the changelog no longer covers (topic
//! deleted or truncated) means that store's local state cannot be trusted: that store alone is
//! emptied and rebuilt from what its changelog still has, counted in a metric, and the worker
//! goes on. The task's other stores keep their state: each is checked against its own changelog.

use crate::cache::{Backend, Changes};
use crate::config::WorkerConfig;
use crate::metrics::{Metrics, StoreLabels};
pub use crate::status::Restored;
use crate::status::Status;
use crate::store::{Change, StoreError};
use crate::task::{Task, TaskState};
use rdkafka::consumer::ConsumerContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("restoring from {topic}: {source}")]
    Kafka {
        topic: String,
        #[source]
        source: KafkaError,
    },
    #[error("restoring task {task}: {source}")]
    Store {
        task: eddy_crds::TaskId,
        #[source]
        source: StoreError,
    },
    #[error("interrupted by shutdown")]
    Interrupted,
}

/// Reaching the end of a changelog is how restore knows it is done, not an error to log.
struct RestoreContext;

impl ClientContext for RestoreContext {
    fn error(&self, error: KafkaError, reason: &str) {
        let eof = matches!(error, KafkaError::PartitionEOF(_))
            || error.rdkafka_error_code() == Some(RDKafkaErrorCode::PartitionEOF);
        if !eof {
            tracing::error!("librdkafka: {error}: {reason}");
        }
    }
}
impl ConsumerContext for RestoreContext {}

/// Bytes of distinct keys and values buffered per changelog partition before they are
/// written to the store. Only a key's last value matters, so a batch keeps one entry per key:
/// a changelog written by frequent commits repeats each key many times, and every repeat
/// dropped here is a memtable insert saved.
pub(crate) const BATCH_BYTES: usize = 2 << 20;

/// The smallest restore (records, one changelog's tasks together) that waits until a status
/// report showed its backlog: smaller ones take milliseconds.
const SHOWN_BACKLOG: i64 = 10_000;

/// A changelog partition restored from at least this many records behind is written without
/// the WAL (and flushed at the end): the WAL would write the whole state a second time, while
/// the final flush of a short tail costs more than logging it.
const UNLOGGED_BACKLOG: i64 = 100_000;

/// librdkafka settings of the restore consumer under the app's `kafka.properties`; public so
/// the engine benchmark's raw read of a changelog (restore's ceiling) uses the same.
pub const RESTORE_CONSUMER_TUNING: &[(&str, &str)] = &[
    ("fetch.max.bytes", "52428800"),
    ("max.partition.fetch.bytes", "10485760"),
    ("queued.max.messages.kbytes", "65536"),
    ("fetch.queue.backoff.ms", "10"),
    // A partition is done when a fetch reports its end (PartitionEOF), and the broker holds
    // a fetch with nothing new for up to this long (default 500 ms).
    ("fetch.wait.max.ms", "10"),
];

/// One partition's records read but not yet written: last value per key.
#[derive(Default)]
pub(crate) struct Pending {
    pub latest: HashMap<Vec<u8>, Option<Vec<u8>>>,
    pub bytes: usize,
    /// Records read into this batch.
    pub read: u64,
    /// Offset after the last record read.
    pub next: i64,
}

impl Pending {
    pub fn add(&mut self, key: &[u8], value: Option<&[u8]>, offset: i64) {
        let vlen = value.map_or(0, <[u8]>::len);
        match self.latest.get_mut(key) {
            Some(v) => {
                self.bytes = self.bytes + vlen - v.as_ref().map_or(0, Vec::len);
                match (v, value) {
                    (Some(old), Some(new)) => {
                        old.clear();
                        old.extend_from_slice(new);
                    }
                    (v, new) => *v = new.map(<[u8]>::to_vec),
                }
            }
            None => {
                self.bytes += key.len() + vlen;
                self.latest.insert(key.to_vec(), value.map(<[u8]>::to_vec));
            }
        }
        self.read += 1;
        self.next = offset + 1;
    }
}

/// Restore every store of `tasks` to the end of its changelog.
pub fn restore(
    cfg: &WorkerConfig,
    tasks: &mut [Task],
    metrics: &Metrics,
    status: &Status,
    cancel: &AtomicBool,
) -> Result<Restored, RestoreError> {
    let mut restored = Restored::new();
    // Records left per task and store, summed per task into the worker's status report.
    let mut remaining: HashMap<String, HashMap<String, i64>> = HashMap::new();
    let mut report = |task: &str, store: &str, left: i64| {
        let per_task = remaining.entry(task.to_string()).or_default();
        per_task.insert(store.to_string(), left);
        let total = per_task.values().sum();
        if let Ok(mut r) = status.report.lock()
            && let Some(t) = r.tasks.get_mut(task)
        {
            t.restore_backlog = total;
            t.lag = Some(total);
            if total > 0 {
                t.state = TaskState::Restoring;
            }
        }
    };
    for t in tasks.iter_mut() {
        t.transition(TaskState::Restoring);
    }
    let changelogs: Vec<String> = {
        let mut v: Vec<String> = tasks
            .iter()
            .flat_map(|t| t.stores.iter().map(|s| s.changelog.clone()))
            .collect();
        v.sort();
        v.dedup();
        v
    };
    let mut shown = false;
    // Tasks whose store received writes without the WAL: flushed before they run.
    let mut unlogged: Vec<usize> = Vec::new();
    for changelog in changelogs {
        let kafka = |source| RestoreError::Kafka {
            topic: changelog.clone(),
            source,
        };
        let consumer: BaseConsumer<RestoreContext> = cfg
            .client_config_with(RESTORE_CONSUMER_TUNING)
            .set("group.id", format!("{}-restore", cfg.application_id))
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .set("enable.partition.eof", "true")
            .set("auto.offset.reset", "earliest")
            .create_with_context(RestoreContext)
            .map_err(kafka)?;
        // partition → (task index, store index, high watermark, written without the WAL)
        let mut targets: HashMap<i32, (usize, usize, i64, bool)> = HashMap::new();
        let mut backlog = 0;
        let mut tpl = TopicPartitionList::new();
        for (ti, t) in tasks.iter_mut().enumerate() {
            let Some(si) = t.stores.iter().position(|s| s.changelog == changelog) else {
                continue;
            };
            let p = t.id.partition;
            let (low, high) = consumer
                .fetch_watermarks(&changelog, p, Duration::from_secs(30))
                .map_err(kafka)?;
            let mut checkpoint = checkpoint_of(t, si)
                .map_err(|source| RestoreError::Store { task: t.id, source })?;
            if let Some(c) = checkpoint
                && (c > high || c < low)
            {
                tracing::warn!(task = %t.id, store = %t.stores[si].name, changelog = %changelog, partition = p, checkpoint = c, low, high,
                    "changelog no longer covers the store's checkpoint: wiping this store's local state and rebuilding it from what the changelog has (the task's other stores are kept)");
                rebuild(t, si).map_err(|source| RestoreError::Store { task: t.id, source })?;
                metrics
                    .stores_rebuilt
                    .get_or_create(&StoreLabels {
                        task: t.id.to_string(),
                        store: t.stores[si].name.clone(),
                    })
                    .inc();
                checkpoint = None;
            }
            let start = checkpoint.unwrap_or(low);
            let labels = StoreLabels {
                task: t.id.to_string(),
                store: t.stores[si].name.clone(),
            };
            metrics
                .restore_remaining
                .get_or_create(&labels)
                .set((high - start).max(0));
            report(&labels.task, &labels.store, (high - start).max(0));
            if start >= high {
                continue;
            }
            backlog += high - start;
            tpl.add_partition_offset(&changelog, p, Offset::Offset(start))
                .map_err(kafka)?;
            let large = high - start >= UNLOGGED_BACKLOG;
            if large && !unlogged.contains(&ti) {
                unlogged.push(ti);
            }
            targets.insert(p, (ti, si, high, large));
        }
        if targets.is_empty() {
            continue;
        }
        // Under the operator, let the app's status show a backlog before restoring: a
        // restore can be over before the next periodic report. Once: later changelogs'
        // backlogs go out with the reports sent while restoring. Not for a tail as short
        // as a caught-up warm-up's or standby's, restored in a few milliseconds: there the
        // wait would be most of the task's pause.
        if !shown && backlog >= SHOWN_BACKLOG {
            status.await_report(Duration::from_secs(2));
            shown = true;
        }
        // Leaders known before assigning: the first fetch goes out at once (see runtime).
        consumer
            .fetch_metadata(Some(&changelog), Duration::from_secs(30))
            .map_err(kafka)?;
        consumer.assign(&tpl).map_err(kafka)?;
        let started = Instant::now();
        let mut pending: HashMap<i32, Pending> = HashMap::new();
        while !targets.is_empty() {
            if status.shutdown.load(Ordering::Relaxed) || cancel.load(Ordering::Relaxed) {
                return Err(RestoreError::Interrupted);
            }
            status.beat();
            let (p, done) = match consumer.poll(Duration::from_millis(200)) {
                None => continue,
                Some(Err(KafkaError::PartitionEOF(p))) => (p, true),
                Some(Err(e)) if crate::fault::is_fatal(&e) => return Err(kafka(e)),
                // librdkafka reconnects and refetches by itself (a broker restarting).
                Some(Err(e)) => {
                    tracing::debug!(changelog = %changelog, "restoring: {e}");
                    continue;
                }
                Some(Ok(m)) => {
                    let entry = pending.entry(m.partition()).or_default();
                    entry.add(m.key().unwrap_or_default(), m.payload(), m.offset());
                    if entry.bytes < BATCH_BYTES {
                        continue;
                    }
                    (m.partition(), false)
                }
            };
            let Some(&(ti, si, high, large)) = targets.get(&p) else {
                continue;
            };
            let batch = pending.remove(&p).unwrap_or_default();
            let (n, mut next) = (batch.read, batch.next);
            let batch: Changes = batch.latest.into_iter().collect();
            if done {
                // Past control records the position can be beyond the last record's offset.
                if let Ok(pos) = consumer.position()
                    && let Some(Offset::Offset(o)) =
                        pos.find_partition(&changelog, p).map(|e| e.offset())
                {
                    next = next.max(o);
                }
            }
            let t = &mut tasks[ti];
            if next > 0 {
                apply(t, si, batch, next, large)
                    .map_err(|source| RestoreError::Store { task: t.id, source })?;
            }
            let labels = StoreLabels {
                task: t.id.to_string(),
                store: t.stores[si].name.clone(),
            };
            *restored
                .entry((labels.task.clone(), labels.store.clone()))
                .or_default() += n;
            metrics.restored_records.get_or_create(&labels).inc_by(n);
            let left = if done { 0 } else { (high - next).max(0) };
            metrics.restore_remaining.get_or_create(&labels).set(left);
            report(&labels.task, &labels.store, left);
            let total = restored[&(labels.task.clone(), labels.store.clone())];
            metrics
                .restore_rate
                .get_or_create(&labels)
                .set(total as f64 / started.elapsed().as_secs_f64().max(1e-3));
            if done {
                targets.remove(&p);
                tracing::info!(task = %t.id, store = %labels.store, records = total, "restored");
            }
        }
    }
    // Writes without the WAL: persist them before the task's first logged commit.
    for t in unlogged.into_iter().filter_map(|ti| tasks.get(ti)) {
        if let Some(db) = &t.db {
            db.flush()
                .map_err(|source| RestoreError::Store { task: t.id, source })?;
        }
    }
    Ok(restored)
}

fn checkpoint_of(t: &Task, si: usize) -> Result<Option<i64>, StoreError> {
    let s = &t.stores[si];
    match (&s.backend, &t.db) {
        (Backend::Memory(m), _) => Ok(m.checkpoint),
        (Backend::Rocks, Some(db)) => db.checkpoint(&s.name),
        (Backend::Rocks, None) => Ok(None),
    }
}

fn apply(
    t: &mut Task,
    si: usize,
    batch: Changes,
    next: i64,
    unlogged: bool,
) -> Result<(), StoreError> {
    let name = t.stores[si].name.clone();
    if t.stores[si].is_in_memory() {
        t.stores[si].apply_in_memory(&batch, Some(next));
        return Ok(());
    }
    let Some(db) = &t.db else { return Ok(()) };
    let changes = batch.iter().map(|(k, v)| {
        (
            name.as_str(),
            Change {
                key: k,
                value: v.as_deref(),
            },
        )
    });
    if unlogged {
        db.write_unlogged(changes, [(name.as_str(), next)])
    } else {
        db.write(changes, [(name.as_str(), next)])
    }
}

/// Empty one store of a task (data and checkpoint together); its other stores are untouched.
fn rebuild(t: &mut Task, si: usize) -> Result<(), StoreError> {
    let s = &mut t.stores[si];
    match (&mut s.backend, &t.db) {
        (Backend::Memory(m), _) => {
            *m = Default::default();
            Ok(())
        }
        (Backend::Rocks, Some(db)) => db.clear(&s.name),
        (Backend::Rocks, None) => Ok(()),
    }
}
