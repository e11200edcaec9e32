//! Restore: before a task processes anything, bring each of its stores up to the end of its
//! changelog, starting from the checkpoint stored with the data, so a restart on the same
//! state directory replays only the tail. A checkpoint the changelog no longer covers (topic
//! deleted or truncated) means that store's local state cannot be trusted: that store alone is
//! emptied and rebuilt from what its changelog still has, counted in a metric, and the worker
//! goes on. The task's other stores keep their state: each is checked against its own changelog.
//! So is a checkpoint older than its changelog keeps tombstones ([`crate::checkpoint`]).
//!
//! Each checkpoint written carries when the store was last at its changelog's end: a store
//! restored to the end it read at time T was caught up at T; on the way there, a store
//! restored from its checkpoint keeps its time and one rebuilt from the beginning counts from
//! the start of its read.

use crate::cache::{Backend, Changes};
use crate::checkpoint;
use crate::config::WorkerConfig;
use crate::ingest::Chunk;
use crate::metrics::{Metrics, StoreLabels};
pub use crate::status::Restored;
use crate::status::Status;
use crate::store::{Change, Checkpoint, Mark, StoreError};
use crate::task::{Task, TaskState};
use rdkafka::consumer::ConsumerContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::cell::Cell;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("restoring from {topic}: {cause}")]
    Kafka { topic: String, cause: KafkaError },
    #[error("restoring task {task}: {cause}")]
    Store {
        task: eddy_crds::TaskId,
        cause: StoreError,
    },
    #[error("interrupted by shutdown")]
    Interrupted,
    #[error("starting the restore's SST writer thread: {0}")]
    Spawn(std::io::Error),
    #[error("the restore's SST writer thread stopped")]
    WriterStopped,
}

/// Reaching the end of a changelog is how restore knows it is done, not an error to log (a
/// global table's restore uses it too).
pub(crate) struct RestoreContext;

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

/// A consumer that reads a topic as a store's changelog: committed records only, from the
/// start where no position is given, telling where each partition ends; it never commits.
pub(crate) fn changelog_reader(
    mut client: rdkafka::ClientConfig,
    group: String,
) -> rdkafka::error::KafkaResult<BaseConsumer<RestoreContext>> {
    client
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest")
        .create_with_context(RestoreContext)
}

/// Bytes of distinct keys and values buffered per changelog partition before they are
/// written to the store. Only a key's last value matters, so a batch keeps one entry per key:
/// a changelog written by frequent commits repeats each key many times, and every repeat
/// dropped here is a memtable insert saved.
pub(crate) const BATCH_BYTES: usize = 2 << 20;

/// The smallest restore (records, one changelog's tasks together) that waits until a status
/// report showed its backlog: smaller ones take milliseconds.
const SHOWN_BACKLOG: i64 = 10_000;

/// A RocksDB store restored from at least this many records behind its changelog's end goes
/// through SST files it ingests (`ingest.rs`) instead of write batches: memtable inserts and
/// the flush behind them cost about twice what building the files directly does. A short
/// tail stays with write batches, where a file per store would cost more than it saves.
const INGEST_BACKLOG: i64 = 100_000;

/// Bytes of changelog records one restore gathers before writing them as an SST file. The
/// ingest path holds at most three such chunks (one filling, one queued, one being written):
/// together half of RocksDB's share of the memory budget, the share the write-buffer manager
/// gives memtables, which this path leaves empty. 32 MiB at the default 256 MiB budget.
pub(crate) fn ingest_chunk_bytes(rocksdb_bytes: usize) -> usize {
    (rocksdb_bytes / 2 / CHUNKS).max(1 << 20)
}

/// Chunks the ingest path allocates at most.
const CHUNKS: usize = 3;

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
    let mut progress = Progress {
        metrics,
        status,
        remaining: HashMap::new(),
        restored: Restored::new(),
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
    // Read now, not at start: a lowered delete.retention.ms applies from the next restore.
    let retention = if changelogs.is_empty() {
        HashMap::new()
    } else {
        let names: Vec<&str> = changelogs.iter().map(String::as_str).collect();
        crate::changelog::tombstone_retention(cfg, &names).map_err(|e| RestoreError::Kafka {
            topic: changelogs.join(", "),
            cause: e.into_kafka(),
        })?
    };
    let mut shown = false;
    for changelog in changelogs {
        let kafka = |source| RestoreError::Kafka {
            topic: changelog.clone(),
            cause: source,
        };
        let tombstones = retention.get(&changelog).copied().flatten();
        let consumer = changelog_reader(
            cfg.client_config_with(RESTORE_CONSUMER_TUNING),
            format!("{}-restore", cfg.application_id),
        )
        .map_err(kafka)?;
        // Restored with write batches, by partition.
        let mut targets: HashMap<i32, Target> = HashMap::new();
        // Restored through SST files, one partition after the other.
        let mut bulk: Vec<Bulk> = Vec::new();
        let mut backlog = 0;
        let mut tpl = TopicPartitionList::new();
        for (ti, t) in tasks.iter_mut().enumerate() {
            let Some(si) = t.stores.iter().position(|s| s.changelog == changelog) else {
                continue;
            };
            let p = t.id.partition;
            // Before the end is read: the end reached was the end at this time at the latest.
            let read_at = crate::record::now_ms();
            let (low, high) = consumer
                .fetch_watermarks(&changelog, p, Duration::from_secs(30))
                .map_err(kafka)?;
            let id = t.id;
            let store_err = move |source| RestoreError::Store {
                task: id,
                cause: source,
            };
            let mut checkpoint = checkpoint_of(t, si).map_err(store_err)?;
            if let Some(c) = checkpoint
                && let Some(why) = checkpoint::check(c, low, high, tombstones, read_at)
            {
                checkpoint::rebuilding(
                    metrics,
                    &why,
                    &t.id.to_string(),
                    &t.stores[si].name,
                    &changelog,
                    p,
                    "the task's other stores are kept",
                );
                rebuild(t, si).map_err(store_err)?;
                checkpoint = None;
            }
            let times = Times {
                read_at,
                meanwhile: checkpoint.is_none().then_some(read_at),
            };
            let start = checkpoint.map_or(low, |c| c.offset);
            progress.left(&t.id.to_string(), &t.stores[si].name, (high - start).max(0));
            if start >= high {
                if checkpoint.is_some() {
                    // At the end already: caught up now.
                    let mark = Mark {
                        offset: None,
                        caught_up_at: Some(read_at),
                    };
                    apply(t, si, Changes::new(), mark).map_err(store_err)?;
                }
                continue;
            }
            backlog += high - start;
            if high - start >= INGEST_BACKLOG && !t.stores[si].is_in_memory() && t.db.is_some() {
                bulk.push(Bulk {
                    partition: p,
                    ti,
                    si,
                    start,
                    high,
                    times,
                });
                continue;
            }
            tpl.add_partition_offset(&changelog, p, Offset::Offset(start))
                .map_err(kafka)?;
            targets.insert(
                p,
                Target {
                    ti,
                    si,
                    high,
                    times,
                },
            );
        }
        if targets.is_empty() && bulk.is_empty() {
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
        let polling = Polling {
            consumer: &consumer,
            changelog: &changelog,
            status,
            cancel,
            polls: Cell::new(0),
        };
        if !targets.is_empty() {
            consumer.assign(&tpl).map_err(kafka)?;
            restore_batches(&polling, tasks, targets, &mut progress)?;
        }
        if !bulk.is_empty() {
            let chunk_bytes = ingest_chunk_bytes(cfg.rocksdb_bytes);
            let result = restore_bulk(&polling, tasks, &bulk, chunk_bytes, &mut progress);
            // Files a failed or interrupted restore did not ingest.
            for b in &bulk {
                if let Some(db) = &tasks[b.ti].db
                    && let Err(e) = db.clear_ingest_dir()
                {
                    tracing::warn!(task = %tasks[b.ti].id, "restore: {e}");
                }
            }
            result?;
        }
    }
    Ok(progress.restored)
}

/// Where each store's restore stands: metrics and the worker's status report.
struct Progress<'a> {
    metrics: &'a Metrics,
    status: &'a Status,
    /// Records left per task and store, summed per task into the worker's status report.
    remaining: HashMap<String, HashMap<String, i64>>,
    restored: Restored,
}

impl Progress<'_> {
    fn left(&mut self, task: &str, store: &str, left: i64) {
        self.metrics
            .restore_remaining
            .get_or_create(&StoreLabels {
                task: task.to_string(),
                store: store.to_string(),
            })
            .set(left);
        let per_task = self.remaining.entry(task.to_string()).or_default();
        per_task.insert(store.to_string(), left);
        let total = per_task.values().sum();
        if let Ok(mut r) = self.status.report.lock()
            && let Some(t) = r.tasks.get_mut(task)
        {
            t.restore_backlog = total;
            t.lag = Some(total);
            if total > 0 {
                t.state = TaskState::Restoring;
            }
        }
    }

    /// `n` more records of a store written, `left` to go; returns the store's total so far.
    fn wrote(&mut self, task: &str, store: &str, n: u64, left: i64, started: Instant) -> u64 {
        let labels = StoreLabels {
            task: task.to_string(),
            store: store.to_string(),
        };
        let total = self
            .restored
            .entry((labels.task.clone(), labels.store.clone()))
            .or_default();
        *total += n;
        let total = *total;
        self.metrics
            .restored_records
            .get_or_create(&labels)
            .inc_by(n);
        self.metrics
            .restore_rate
            .get_or_create(&labels)
            .set(total as f64 / started.elapsed().as_secs_f64().max(1e-3));
        self.left(task, store, left);
        total
    }
}

/// The restore consumer of one changelog and what can stop it.
struct Polling<'a> {
    consumer: &'a BaseConsumer<RestoreContext>,
    changelog: &'a str,
    status: &'a Status,
    cancel: &'a AtomicBool,
    polls: Cell<u32>,
}

enum Polled<'a> {
    Record(BorrowedMessage<'a>),
    /// The partition's end: reached.
    End(i32),
    Nothing,
}

impl Polling<'_> {
    fn kafka(&self, source: KafkaError) -> RestoreError {
        RestoreError::Kafka {
            topic: self.changelog.to_string(),
            cause: source,
        }
    }

    fn poll(&self) -> Result<Polled<'_>, RestoreError> {
        if self.status.shutdown.load(Ordering::Relaxed) || self.cancel.load(Ordering::Relaxed) {
            return Err(RestoreError::Interrupted);
        }
        // A heartbeat reads the clock: once per 256 records is plenty at millions a second.
        let polls = self.polls.get().wrapping_add(1);
        self.polls.set(polls);
        if polls.is_multiple_of(256) {
            self.status.beat();
        }
        match self.consumer.poll(Duration::from_millis(200)) {
            None => {
                self.status.beat();
                Ok(Polled::Nothing)
            }
            Some(Err(KafkaError::PartitionEOF(p))) => Ok(Polled::End(p)),
            Some(Err(e)) if crate::fault::is_fatal(&e) => Err(self.kafka(e)),
            // librdkafka reconnects and refetches by itself (a broker restarting).
            Some(Err(e)) => {
                tracing::debug!(changelog = %self.changelog, "restoring: {e}");
                Ok(Polled::Nothing)
            }
            Some(Ok(m)) => Ok(Polled::Record(m)),
        }
    }

    /// Where partition `p`, at its end, has been read to: past control records the position
    /// can be beyond the last record's offset (`next`).
    fn end(&self, p: i32, next: i64) -> i64 {
        if let Ok(pos) = self.consumer.position()
            && let Some(Offset::Offset(o)) =
                pos.find_partition(self.changelog, p).map(|e| e.offset())
        {
            return next.max(o);
        }
        next
    }
}

/// The times a restore writes with a store's checkpoints.
#[derive(Clone, Copy)]
struct Times {
    /// When the end to reach was read: the store is caught up at this time once there.
    read_at: i64,
    /// The time written on the way: None keeps the checkpoint's (restored from it); a store
    /// read from the beginning counts from the start of the read.
    meanwhile: Option<i64>,
}

impl Times {
    fn mark(self, offset: i64, at_end: bool) -> Mark {
        Mark {
            offset: Some(offset),
            caught_up_at: if at_end {
                Some(self.read_at)
            } else {
                self.meanwhile
            },
        }
    }
}

/// A changelog partition restored in write batches.
struct Target {
    ti: usize,
    si: usize,
    /// Its end when the restore started.
    high: i64,
    times: Times,
}

/// Restore the assigned partitions (`targets`) in write batches of up to [`BATCH_BYTES`]
/// per partition, each with the store's new checkpoint.
fn restore_batches(
    polling: &Polling,
    tasks: &mut [Task],
    mut targets: HashMap<i32, Target>,
    progress: &mut Progress,
) -> Result<(), RestoreError> {
    let started = Instant::now();
    let mut pending: HashMap<i32, Pending> = HashMap::new();
    while !targets.is_empty() {
        let (p, done) = match polling.poll()? {
            Polled::Nothing => continue,
            Polled::End(p) => (p, true),
            Polled::Record(m) => {
                let entry = pending.entry(m.partition()).or_default();
                entry.add(m.key().unwrap_or_default(), m.payload(), m.offset());
                if entry.bytes < BATCH_BYTES {
                    continue;
                }
                (m.partition(), false)
            }
        };
        let Some(&Target {
            ti,
            si,
            high,
            times,
        }) = targets.get(&p)
        else {
            continue;
        };
        let batch = pending.remove(&p).unwrap_or_default();
        let (n, mut next) = (batch.read, batch.next);
        let batch: Changes = batch.latest.into_iter().collect();
        if done {
            next = polling.end(p, next);
        }
        let t = &mut tasks[ti];
        if next > 0 {
            apply(t, si, batch, times.mark(next, done)).map_err(|source| RestoreError::Store {
                task: t.id,
                cause: source,
            })?;
        }
        let left = if done { 0 } else { (high - next).max(0) };
        let (task, store) = (t.id.to_string(), t.stores[si].name.clone());
        let total = progress.wrote(&task, &store, n, left, started);
        if done {
            targets.remove(&p);
            tracing::info!(task = %task, store = %store, records = total, "restored");
        }
    }
    Ok(())
}

/// A changelog partition to restore through SST files.
struct Bulk {
    partition: i32,
    ti: usize,
    si: usize,
    start: i64,
    high: i64,
    times: Times,
}

/// A chunk for the SST writer thread.
struct SstJob {
    ti: usize,
    si: usize,
    chunk: Chunk,
    options: rocksdb::Options,
    /// Written with statistics on, to judge whether the data compresses (see
    /// [`Pipeline::compress`]).
    judged: bool,
    path: PathBuf,
    /// The partition's last chunk: the store is restored once it is ingested.
    last: bool,
    high: i64,
    times: Times,
}

/// A chunk written: its file (none if it had no record) to ingest, in order.
struct SstDone {
    file: Option<PathBuf>,
    job: SstJob,
}

/// Restore `bulk`'s partitions one after the other (so each chunk is as large as memory
/// allows, see [`ingest_chunk_bytes`]): this thread reads records into chunks, a second
/// thread sorts each chunk and writes it as an SST file, and this thread ingests the files
/// in changelog order, each followed by its checkpoint.
fn restore_bulk(
    polling: &Polling,
    tasks: &[Task],
    bulk: &[Bulk],
    chunk_bytes: usize,
    progress: &mut Progress,
) -> Result<(), RestoreError> {
    std::thread::scope(|scope| {
        let (jobs, queued) = mpsc::sync_channel::<SstJob>(1);
        let (written, done) = mpsc::channel::<Written>();
        std::thread::Builder::new()
            .name("eddy-restore-sst".into())
            .spawn_scoped(scope, move || {
                for mut job in queued {
                    let r = match job.chunk.write_sst(&job.options, &job.path) {
                        Ok(file) => Ok(SstDone { file, job }),
                        Err(e) => Err((job.ti, e)),
                    };
                    if written.send(r).is_err() {
                        break;
                    }
                }
            })
            .map_err(RestoreError::Spawn)?;
        let mut pipe = Pipeline {
            tasks,
            jobs,
            done,
            spare: Vec::new(),
            compress: None,
            allocated: 0,
            in_flight: 0,
            chunk_bytes,
            started: Instant::now(),
        };
        for b in bulk {
            let t = &tasks[b.ti];
            let Some(db) = &t.db else { continue };
            db.clear_ingest_dir().map_err(pipe.store_err(b.ti))?;
            let dir = db.ingest_dir().map_err(pipe.store_err(b.ti))?;
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(polling.changelog, b.partition, Offset::Offset(b.start))
                .map_err(|e| polling.kafka(e))?;
            polling
                .consumer
                .assign(&tpl)
                .map_err(|e| polling.kafka(e))?;
            let store = t.stores[b.si].name.as_str();
            let mut seq = 0u64;
            let mut send = |pipe: &mut Pipeline, chunk: Chunk, last: bool| {
                seq += 1;
                let judged = pipe.compress.is_none();
                let options = match pipe.compress {
                    None => crate::ingest::Compression::watched(db.sst_options()),
                    Some(true) => db.sst_options().clone(),
                    Some(false) => db.plain_sst_options().clone(),
                };
                pipe.send(SstJob {
                    ti: b.ti,
                    si: b.si,
                    chunk,
                    options,
                    judged,
                    path: dir.join(format!("{}-{seq}.sst", b.partition)),
                    last,
                    high: b.high,
                    times: b.times,
                })
            };
            let mut chunk = pipe.chunk(progress)?;
            chunk.reset(b.start);
            loop {
                pipe.drain(progress)?;
                match polling.poll()? {
                    Polled::End(p) if p == b.partition => {
                        chunk.next = polling.end(p, chunk.next);
                        send(&mut pipe, chunk, true)?;
                        break;
                    }
                    Polled::Record(m) if m.partition() == b.partition => {
                        // Sorted and deduplicated as the family stores them.
                        let key = db.stored_key(store, m.key().unwrap_or_default());
                        let (key, value) = (key.as_ref(), m.payload());
                        if !chunk.fits(key, value) {
                            let next = chunk.next;
                            send(&mut pipe, chunk, false)?;
                            chunk = pipe.chunk(progress)?;
                            chunk.reset(next);
                        }
                        chunk.push(key, value, m.offset());
                    }
                    // Nothing yet, or the end of a partition restored before.
                    _ => {}
                }
            }
        }
        pipe.finish(progress)
    })
}

type Written = Result<SstDone, (usize, StoreError)>;

/// Chunks between this thread and the SST writer thread.
struct Pipeline<'a> {
    tasks: &'a [Task],
    jobs: mpsc::SyncSender<SstJob>,
    done: mpsc::Receiver<Written>,
    /// Chunks written and ingested, to fill again.
    spare: Vec<Chunk>,
    /// Whether this changelog's data compresses, once RocksDB's verdicts on the blocks of a
    /// file showed it (for all its partitions: one app writes them alike). LZ4 over data it
    /// cannot shrink was a third of the SST writer's time, for files no smaller.
    compress: Option<bool>,
    allocated: usize,
    /// Chunks sent to the writer and not ingested yet.
    in_flight: usize,
    chunk_bytes: usize,
    started: Instant,
}

impl Pipeline<'_> {
    fn store_err(&self, ti: usize) -> impl Fn(StoreError) -> RestoreError + use<> {
        let task = self.tasks[ti].id;
        move |source| RestoreError::Store {
            task,
            cause: source,
        }
    }

    fn send(&mut self, job: SstJob) -> Result<(), RestoreError> {
        self.jobs
            .send(job)
            .map_err(|_| RestoreError::WriterStopped)?;
        self.in_flight += 1;
        Ok(())
    }

    /// Ingest a written chunk, then checkpoint it; its buffers go back to the spares.
    fn ingest(&mut self, r: Written, progress: &mut Progress) -> Result<(), RestoreError> {
        self.in_flight -= 1;
        let SstDone { file, job } = r.map_err(|(ti, e)| self.store_err(ti)(e))?;
        let t = &self.tasks[job.ti];
        let store = &t.stores[job.si].name;
        if job.judged && self.compress.is_none() && file.is_some() {
            let tally = crate::ingest::Compression::of(&job.options);
            self.compress = tally.compresses();
            if self.compress == Some(false) {
                tracing::info!(task = %t.id, store = %store, compressed_bytes = tally.kept, plain_bytes = tally.stored_plain,
                    "restore: RocksDB could not shrink this store's data; the rest of this restore of its changelog (every partition) writes SST files without compression");
            }
        }
        if let Some(db) = &t.db {
            db.ingest(
                store,
                file.as_deref(),
                job.times.mark(job.chunk.next, job.last),
            )
            .map_err(self.store_err(job.ti))?;
        }
        let left = if job.last {
            0
        } else {
            (job.high - job.chunk.next).max(0)
        };
        let task = t.id.to_string();
        let total = progress.wrote(&task, store, job.chunk.read, left, self.started);
        if job.last {
            tracing::info!(task = %task, store = %store, records = total, via = "SST files", "restored");
        }
        self.spare.push(job.chunk);
        Ok(())
    }

    /// Ingest what the writer has finished, without waiting.
    fn drain(&mut self, progress: &mut Progress) -> Result<(), RestoreError> {
        while let Ok(r) = self.done.try_recv() {
            self.ingest(r, progress)?;
        }
        Ok(())
    }

    /// A chunk to fill: a spare one, a new one while fewer than [`CHUNKS`] exist, else the
    /// next one the writer finishes (this bounds restore's memory).
    fn chunk(&mut self, progress: &mut Progress) -> Result<Chunk, RestoreError> {
        loop {
            if let Some(c) = self.spare.pop() {
                return Ok(c);
            }
            if self.allocated < CHUNKS || self.in_flight == 0 {
                self.allocated += 1;
                return Ok(Chunk::with_capacity(self.chunk_bytes));
            }
            let r = self.done.recv().map_err(|_| RestoreError::WriterStopped)?;
            self.ingest(r, progress)?;
        }
    }

    /// Wait for the writer to finish every chunk, and ingest them.
    fn finish(mut self, progress: &mut Progress) -> Result<(), RestoreError> {
        while self.in_flight > 0 {
            let r = self.done.recv().map_err(|_| RestoreError::WriterStopped)?;
            self.ingest(r, progress)?;
        }
        Ok(())
    }
}

fn checkpoint_of(t: &Task, si: usize) -> Result<Option<Checkpoint>, StoreError> {
    let s = &t.stores[si];
    match (&s.backend, &t.db) {
        (Backend::Memory(m), _) => Ok(m.read().stored_checkpoint()),
        (Backend::Rocks, Some(db)) => db.stored_checkpoint(&s.name),
        (Backend::Rocks, None) => Ok(None),
    }
}

fn apply(t: &mut Task, si: usize, batch: Changes, mark: Mark) -> Result<(), StoreError> {
    let name = t.stores[si].name.clone();
    if t.stores[si].is_in_memory() {
        t.stores[si].apply_in_memory(&batch, mark);
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
    db.write(changes, [(name.as_str(), mark)])
}

/// Empty one store of a task (data and checkpoint together); its other stores are untouched.
fn rebuild(t: &mut Task, si: usize) -> Result<(), StoreError> {
    let s = &mut t.stores[si];
    match (&mut s.backend, &t.db) {
        (Backend::Memory(m), _) => {
            m.clear();
            Ok(())
        }
        (Backend::Rocks, Some(db)) => db.clear(&s.name),
        (Backend::Rocks, None) => Ok(()),
    }
}
