//! Prometheus metrics of a worker, in OpenMetrics text on `/metrics`. Names follow Kafka
//! Streams' where one exists (`records processed`, `restore remaining`, `task state`...).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TaskLabels {
    pub task: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreLabels {
    pub task: String,
    pub store: String,
}

/// A store shard rebuilt, and why (see [`crate::checkpoint::Distrust::reason`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RebuiltLabels {
    pub task: String,
    pub store: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TaskStateLabels {
    pub task: String,
    pub state: TaskStateLabel,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum TaskStateLabel {
    CREATED,
    RESTORING,
    RUNNING,
    SUSPENDED,
    CLOSED,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartitionLabels {
    pub topic: String,
    pub partition: i32,
    /// The task reading the partition (`<subtopology>_<partition>`).
    pub task: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub task: String,
    /// `skip`, `dead_letter` or `dropped` (null key/value in an aggregation).
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RoleLabels {
    /// `standby` or `warmup`.
    pub role: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// The worker problem's reason (`KafkaUnavailable`, `StateStoreUnavailable`, ...).
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// A query token's review: `allowed`, `denied`, `unauthenticated` or `error`.
    pub result: String,
}

/// Something that knows how much memory one part of the process holds, read at each scrape
/// of `eddy_memory_bytes` (RocksDB's shared cache, the allocator).
pub trait MemoryUse: Send + Sync {
    /// `(part, bytes)` pairs; a part's name is the `part` label.
    fn memory_parts(&self) -> Vec<(&'static str, usize)>;
}

/// A memory source and the name it was set under.
type NamedSource = (&'static str, Arc<dyn MemoryUse>);

/// `eddy_memory_bytes{part}` and `eddy_memory_budget_bytes`: where the process's memory goes,
/// so an RSS over `memory.budget` can be told apart (RocksDB, record caches, the allocator).
#[derive(Clone, Default)]
struct MemoryCollector {
    sources: Arc<Mutex<Vec<NamedSource>>>,
    record_cache: Arc<AtomicUsize>,
    budget: Arc<AtomicUsize>,
}

impl std::fmt::Debug for MemoryCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MemoryCollector")
    }
}

impl Collector for MemoryCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let sources = self
            .sources
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let mut parts = vec![("record_cache", self.record_cache.load(Ordering::Relaxed))];
        parts.extend(sources.iter().flat_map(|(_, s)| s.memory_parts()));
        let mut family = encoder.encode_descriptor(
            "eddy_memory_bytes",
            "Memory the worker holds, by part: rocksdb_blocks and rocksdb_memtables (RocksDB's shared cache, sized from memory.budget), record_cache (every task's record cache), heap_allocated and heap_resident (all allocations, and the pages the allocator holds for them)",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        let gauge = |n: usize| ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX));
        for (part, bytes) in parts {
            let labels = [("part", part)];
            gauge(bytes).encode(family.encode_family(&labels)?)?;
        }
        let budget = self.budget.load(Ordering::Relaxed);
        if budget > 0 {
            let g = gauge(budget);
            g.encode(encoder.encode_descriptor(
                "eddy_memory_budget_bytes",
                "The app's memory.budget: the state memory (RocksDB and record caches) the worker keeps within",
                None,
                g.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

/// Every metric a worker exports.
pub struct Metrics {
    pub registry: Registry,
    pub records_processed: Family<TaskLabels, Counter>,
    pub commit_seconds: Histogram,
    pub commits: Counter,
    pub restore_remaining: Family<StoreLabels, Gauge>,
    pub restore_rate: Family<StoreLabels, Gauge<f64, AtomicU64>>,
    pub restored_records: Family<StoreLabels, Counter>,
    pub task_state: Family<TaskStateLabels, Gauge>,
    pub store_keys: Family<StoreLabels, Gauge>,
    pub store_bytes: Family<StoreLabels, Gauge>,
    pub cache_hits: Family<StoreLabels, Counter>,
    pub cache_misses: Family<StoreLabels, Counter>,
    pub consumer_lag: Family<PartitionLabels, Gauge>,
    pub bad_records: Family<OutcomeLabels, Counter>,
    pub stores_rebuilt: Family<RebuiltLabels, Counter>,
    pub recoveries: Family<ReasonLabels, Counter>,
    pub standby_tasks: Family<RoleLabels, Gauge>,
    pub standby_lag: Family<StoreLabels, Gauge>,
    pub standby_updated: Family<StoreLabels, Counter>,
    pub query_token_reviews: Family<ResultLabels, Counter>,
    pub query_token_review_seconds: Histogram,
    pub queries_refused: Family<ReasonLabels, Counter>,
    /// The partitions `consumer_lag` has series for (a Family cannot list its own).
    lag_partitions: Mutex<HashSet<PartitionLabels>>,
    memory: MemoryCollector,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let m = Metrics {
            records_processed: Family::default(),
            commit_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            commits: Counter::default(),
            restore_remaining: Family::default(),
            restore_rate: Family::default(),
            restored_records: Family::default(),
            task_state: Family::default(),
            store_keys: Family::default(),
            store_bytes: Family::default(),
            cache_hits: Family::default(),
            cache_misses: Family::default(),
            consumer_lag: Family::default(),
            bad_records: Family::default(),
            stores_rebuilt: Family::default(),
            recoveries: Family::default(),
            standby_tasks: Family::default(),
            standby_lag: Family::default(),
            standby_updated: Family::default(),
            query_token_reviews: Family::default(),
            query_token_review_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            queries_refused: Family::default(),
            lag_partitions: Mutex::default(),
            memory: MemoryCollector::default(),
            registry: Registry::default(),
        };
        let r = registry.sub_registry_with_prefix("eddy");
        eddy_telemetry::register_build_info(r, env!("CARGO_PKG_VERSION"));
        r.register(
            "records_processed",
            "Input records processed, per task",
            m.records_processed.clone(),
        );
        r.register(
            "commit_duration_seconds",
            "Time to commit all tasks (flush, Kafka commit, store write)",
            m.commit_seconds.clone(),
        );
        r.register("commits", "Commits of all tasks", m.commits.clone());
        r.register(
            "restore_remaining_records",
            "Changelog records left to restore, per task and store",
            m.restore_remaining.clone(),
        );
        r.register(
            "restore_rate_records_per_second",
            "Restore speed of the last restore, per task and store",
            m.restore_rate.clone(),
        );
        r.register(
            "restored_records",
            "Changelog records restored, per task and store",
            m.restored_records.clone(),
        );
        r.register(
            "task_state",
            "1 for the state a task is in",
            m.task_state.clone(),
        );
        r.register(
            "store_keys_estimate",
            "Estimated keys in a store shard",
            m.store_keys.clone(),
        );
        r.register(
            "store_bytes_estimate",
            "Estimated live bytes of a store shard",
            m.store_bytes.clone(),
        );
        r.register(
            "record_cache_hits",
            "Store reads served by the record cache",
            m.cache_hits.clone(),
        );
        r.register(
            "record_cache_misses",
            "Store reads that went to the store",
            m.cache_misses.clone(),
        );
        r.register(
            "consumer_lag_records",
            "Records between the position and the end of an input partition, per task (librdkafka's statistics, every 5 s)",
            m.consumer_lag.clone(),
        );
        r.register(
            "bad_records",
            "Records skipped, dead-lettered or dropped instead of processed",
            m.bad_records.clone(),
        );
        r.register(
            "stores_rebuilt",
            "Store shards emptied and rebuilt from their changelog's beginning, by reason: changelog_truncated (the changelog no longer covered their checkpoint), tombstones_expired (the checkpoint was older than the changelog keeps tombstones)",
            m.stores_rebuilt.clone(),
        );
        r.register(
            "recoveries",
            "Times the worker dropped its uncommitted work and resumed its tasks from the last commit (Kafka outage, fenced or aborted transaction, state store I/O error), by reason",
            m.recoveries.clone(),
        );
        r.register(
            "standby_tasks",
            "Standby and warm-up tasks this worker keeps up to date, by role",
            m.standby_tasks.clone(),
        );
        r.register(
            "standby_lag_records",
            "Changelog records a standby or warm-up store lacks (changelog end minus its checkpoint), per task and store",
            m.standby_lag.clone(),
        );
        r.register(
            "standby_updated_records",
            "Changelog records applied to standby and warm-up stores, per task and store",
            m.standby_updated.clone(),
        );
        r.register(
            "query_token_reviews",
            "Query tokens reviewed by the Kubernetes API server (one per token per 10 s), by result: allowed, denied, unauthenticated, error",
            m.query_token_reviews.clone(),
        );
        r.register(
            "query_token_review_duration_seconds",
            "Time the Kubernetes API server took to review a query token",
            m.query_token_review_seconds.clone(),
        );
        r.register(
            "queries_refused",
            "Queries refused before they were read, by reason: unauthenticated (401), forbidden (403), review_unavailable (503: the token could not be checked)",
            m.queries_refused.clone(),
        );
        registry.register_collector(Box::new(m.memory.clone()));
        // Standard names, without the prefix.
        eddy_telemetry::register_process_metrics(&mut registry);
        Metrics { registry, ..m }
    }

    /// Set the state gauge of a task: 1 for its current state, 0 for the others.
    pub fn set_task_state(&self, task: &str, state: TaskStateLabel) {
        use TaskStateLabel::*;
        for s in [CREATED, RESTORING, RUNNING, SUSPENDED, CLOSED] {
            self.task_state
                .get_or_create(&TaskStateLabels {
                    task: task.to_string(),
                    state: s,
                })
                .set(i64::from(s == state));
        }
    }

    /// The consumer lag of every input partition the consumer fetches now (None: not known
    /// this time, the last value stays). Partitions it no longer fetches lose their series,
    /// so a task that moved to another worker leaves no lag behind here.
    pub fn set_consumer_lags(&self, lags: Vec<(PartitionLabels, Option<i64>)>) {
        let mut shown = self
            .lag_partitions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now: HashSet<PartitionLabels> = lags.iter().map(|(l, _)| l.clone()).collect();
        for gone in shown.difference(&now) {
            self.consumer_lag.remove(gone);
        }
        for (labels, lag) in lags {
            if let Some(lag) = lag {
                self.consumer_lag.get_or_create(&labels).set(lag);
            }
        }
        *shown = now;
    }

    /// Remove the gauges of a task this worker let go (released, moved, its restore
    /// cancelled): `/metrics` shows the tasks the worker holds, so a state or restore alert
    /// never fires for a task that lives elsewhere now. Counters stay.
    pub fn forget_task<'a>(&self, task: &str, stores: impl IntoIterator<Item = &'a str>) {
        use TaskStateLabel::*;
        for state in [CREATED, RESTORING, RUNNING, SUSPENDED, CLOSED] {
            self.task_state.remove(&TaskStateLabels {
                task: task.to_string(),
                state,
            });
        }
        for store in stores {
            let labels = StoreLabels {
                task: task.to_string(),
                store: store.to_string(),
            };
            self.restore_remaining.remove(&labels);
            self.restore_rate.remove(&labels);
        }
    }

    /// Report `source`'s parts in `eddy_memory_bytes` from now on, instead of an earlier
    /// source of the same `name` (an embedder running the engine again, say).
    pub fn set_memory_source(&self, name: &'static str, source: Arc<dyn MemoryUse>) {
        let mut sources = self
            .memory
            .sources
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        sources.retain(|(n, _)| *n != name);
        sources.push((name, source));
    }

    /// The app's `memory.budget`, for `eddy_memory_budget_bytes`.
    pub fn set_memory_budget(&self, bytes: usize) {
        self.memory.budget.store(bytes, Ordering::Relaxed);
    }

    /// The bytes of every task's record cache together.
    pub fn set_record_cache_bytes(&self, bytes: usize) {
        self.memory.record_cache.store(bytes, Ordering::Relaxed);
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;
    impl MemoryUse for Fixed {
        fn memory_parts(&self) -> Vec<(&'static str, usize)> {
            vec![("rocksdb_blocks", 7 << 20)]
        }
    }

    #[test]
    fn memory_is_reported_by_part_with_the_budget() {
        let m = Metrics::new();
        m.set_memory_source("fixed", Arc::new(Fixed));
        m.set_memory_source("fixed", Arc::new(Fixed));
        m.set_record_cache_bytes(3 << 20);
        m.set_memory_budget(256 << 20);
        let text = m.encode();
        for line in [
            "eddy_memory_bytes{part=\"record_cache\"} 3145728",
            "eddy_memory_bytes{part=\"rocksdb_blocks\"} 7340032\n",
            "eddy_memory_budget_bytes 268435456",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        // A source set again replaces the earlier one.
        assert_eq!(text.matches("part=\"rocksdb_blocks\"").count(), 1, "{text}");
    }
}
