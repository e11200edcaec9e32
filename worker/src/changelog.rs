//! Changelog and other internal topics: which ones an app needs, with what partition counts
//! and configs, and creating those that are missing. A changelog has one partition per task
//! of its sub-topology and is compacted, so it holds the latest value of every key: restore
//! is a plain copy of it. Also what the worker must know of every topic it writes: partition
//! counts, and the limits the broker enforces on records (see [`TopicLimits`]).

use crate::config::WorkerConfig;
use eddy_crds::topics;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use std::collections::HashMap;
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum TopicError {
    #[error("cannot reach Kafka at {servers}: {cause}")]
    Unreachable { servers: String, cause: KafkaError },
    #[error("topic {topic:?} does not exist: create it first (it is {role})")]
    Missing { topic: String, role: &'static str },
    #[error(
        "internal topic {topic:?} has {actual} partitions but needs {expected}: delete it (the app's state will be rebuilt) or fix the source topic"
    )]
    WrongPartitions {
        topic: String,
        actual: i32,
        expected: i32,
    },
    #[error("cannot create topic {topic:?}: {code}")]
    Create {
        topic: String,
        code: RDKafkaErrorCode,
    },
    #[error(transparent)]
    Plan(topics::PlanError),
    #[error("starting an async runtime for the Kafka admin client: {0}")]
    Runtime(std::io::Error),
    #[error("reading the configs of topic {topic:?}: {code}")]
    Configs {
        topic: String,
        code: RDKafkaErrorCode,
    },
}

impl TopicError {
    /// As a Kafka error, for readers whose errors are Kafka errors (restore, the state
    /// updater, global tables): the same code, so it is retried or not alike.
    pub fn into_kafka(self) -> KafkaError {
        match self {
            TopicError::Unreachable { cause: source, .. } => source,
            TopicError::Create { code, .. } | TopicError::Configs { code, .. } => {
                KafkaError::AdminOp(code)
            }
            other => KafkaError::AdminOpCreation(other.to_string()),
        }
    }

    /// True when the error can go away by itself (Kafka unreachable or slow to answer).
    pub fn is_transient(&self) -> bool {
        match self {
            TopicError::Unreachable { cause: source, .. } => !crate::fault::is_fatal(source),
            TopicError::Create { code, .. } | TopicError::Configs { code, .. } => {
                !crate::fault::is_fatal_code(*code)
                    && !matches!(
                        code,
                        RDKafkaErrorCode::PolicyViolation
                            | RDKafkaErrorCode::InvalidReplicationFactor
                            | RDKafkaErrorCode::InvalidPartitions
                            | RDKafkaErrorCode::InvalidTopic
                    )
            }
            TopicError::Missing { .. }
            | TopicError::Plan(_)
            | TopicError::WrongPartitions { .. }
            | TopicError::Runtime(_) => false,
        }
    }
}

/// What the broker accepts on a topic, as far as a record's producer can check it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TopicLimits {
    /// The topic's `max.message.bytes`: the broker rejects a larger record batch.
    pub max_message_bytes: usize,
    /// `cleanup.policy` includes `compact`: the broker rejects records without a key.
    pub compacted: bool,
    /// A compression codec is set: batches are checked compressed, so sizes cannot be
    /// checked before sending.
    pub compressed: bool,
    /// With `message.timestamp.type=CreateTime`, how far before and after the broker's
    /// clock a record's timestamp may be, in ms (`message.timestamp.before.max.ms` and
    /// `.after.max.ms`; Kafka 4 rejects records more than an hour ahead by default).
    pub timestamp_bounds: Option<(i64, i64)>,
}

/// Bytes a record adds to a batch besides its key, value and headers (varint lengths,
/// timestamp and offset deltas, attributes), plus a batch's own header: an upper bound, so a
/// record this check passes fits the topic's limit.
const RECORD_OVERHEAD: usize = 61 + 31;

impl TopicLimits {
    pub fn check(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        header_bytes: usize,
    ) -> Result<(), String> {
        if self.compacted && key.is_none() {
            return Err(format!(
                "record without a key for {topic}, a compacted topic (cleanup.policy=compact): give it a key or write it to another topic"
            ));
        }
        let size = RECORD_OVERHEAD
            + key.map_or(0, <[u8]>::len)
            + value.map_or(0, <[u8]>::len)
            + header_bytes;
        if !self.compressed && size > self.max_message_bytes {
            return Err(format!(
                "record of {size} bytes is larger than {topic}'s max.message.bytes ({}): raise the topic's max.message.bytes or make the record smaller",
                self.max_message_bytes
            ));
        }
        Ok(())
    }
}

/// What the worker knows of the topics it reads and writes.
#[derive(Clone, Debug, Default)]
pub struct Topics {
    pub partitions: PartitionCounts,
    /// Limits of every topic the app writes.
    pub limits: HashMap<String, TopicLimits>,
}

impl Topics {
    /// Whether every topic written takes a record with this timestamp at `now_ms` (epoch
    /// ms): a time from a `timestamp` step that one of them refuses would stop the task at
    /// send, after its stores changed, so the step refuses the record instead.
    pub fn check_timestamp(&self, timestamp: i64, now_ms: i64) -> Result<(), String> {
        for (topic, l) in &self.limits {
            let Some((before, after)) = l.timestamp_bounds else {
                continue;
            };
            if timestamp > now_ms.saturating_add(after) {
                return Err(format!(
                    "timestamp {timestamp} is more than {after} ms ahead of now ({now_ms}): {topic} refuses it (message.timestamp.after.max.ms); correct the timestamp or raise the topic's setting"
                ));
            }
            if timestamp < now_ms.saturating_sub(before) {
                return Err(format!(
                    "timestamp {timestamp} is more than {before} ms before now ({now_ms}): {topic} refuses it (message.timestamp.before.max.ms); correct the timestamp or raise the topic's setting"
                ));
            }
        }
        Ok(())
    }

    /// The smallest `max.message.bytes` of the topics written, if a batch must stay below
    /// the producer's default batch size (1 MB) to fit it.
    pub fn batch_bytes(&self) -> Option<usize> {
        self.limits
            .values()
            .filter(|l| !l.compressed)
            .map(|l| l.max_message_bytes)
            .min()
            .filter(|&b| b < 1_000_000)
    }
}

pub use eddy_crds::topics::InternalTopic;

/// Topic name → partition count, for every topic the app reads or writes.
pub type PartitionCounts = HashMap<String, i32>;

/// The internal topics an app needs, given the partition counts of its external topics.
pub fn plan(
    cfg: &WorkerConfig,
    external: &PartitionCounts,
) -> Result<Vec<InternalTopic>, TopicError> {
    let subs: Vec<topics::SubLayout> = cfg
        .topology
        .subtopologies
        .iter()
        .map(|s| topics::SubLayout {
            source: s.source().topic.clone(),
            internal: s.source().internal,
            joined: s.inputs[1..]
                .iter()
                .map(|i| match &i.table {
                    Some(t) => topics::JoinedInput::table(t, &i.source.topic),
                    None => topics::JoinedInput::stream(&i.source.topic),
                })
                .collect(),
            stores: s
                .stores
                .iter()
                .map(|d| topics::StoreLayout {
                    name: d.name.clone(),
                    kind: d.kind(),
                })
                .collect(),
        })
        .collect();
    let dead_letter = cfg.on_error == eddy_crds::OnError::DeadLetter;
    let globals: Vec<String> = cfg
        .topology
        .globals
        .iter()
        .map(|g| g.topic.clone())
        .collect();
    topics::plan(&cfg.application_id, &subs, &globals, dead_letter, |t| {
        external.get(t).copied()
    })
    .map(|(topics, _)| topics)
    .map_err(|e| match e {
        topics::PlanError::Missing(topic) => TopicError::Missing {
            topic,
            role: "a source of the topology",
        },
        e => TopicError::Plan(e),
    })
}

/// Partition counts of existing topics, and the number of brokers.
pub fn describe(
    cfg: &WorkerConfig,
    timeout: Duration,
) -> Result<(PartitionCounts, usize), TopicError> {
    let unreachable = |source| TopicError::Unreachable {
        servers: cfg.bootstrap_servers.clone(),
        cause: source,
    };
    let consumer: BaseConsumer = cfg.client_config().create().map_err(unreachable)?;
    let md = consumer
        .fetch_metadata(None, timeout)
        .map_err(unreachable)?;
    let counts = md
        .topics()
        .iter()
        .filter(|t| t.error().is_none() && !t.partitions().is_empty())
        .map(|t| (t.name().to_string(), t.partitions().len() as i32))
        .collect();
    Ok((counts, md.brokers().len()))
}

/// Make sure every topic the app uses exists with the right partition count, creating missing
/// internal topics. Returns the partition counts of all of them, and the limits of those the
/// app writes.
pub fn prepare(cfg: &WorkerConfig) -> Result<Topics, TopicError> {
    let timeout = Duration::from_secs(10);
    let (mut counts, brokers) = describe(cfg, timeout)?;
    let internal = plan(cfg, &counts)?;
    for sub in &cfg.topology.subtopologies {
        for sink in sub.sinks.iter().filter(|s| !s.internal) {
            if !counts.contains_key(&sink.topic) {
                return Err(TopicError::Missing {
                    topic: sink.topic.clone(),
                    role: "an output of the topology",
                });
            }
        }
    }
    let mut missing = Vec::new();
    for t in &internal {
        match counts.get(&t.name) {
            Some(&actual) if actual != t.partitions => {
                return Err(TopicError::WrongPartitions {
                    topic: t.name.clone(),
                    actual,
                    expected: t.partitions,
                });
            }
            Some(_) => {}
            None => missing.push(t),
        }
    }
    if !missing.is_empty() {
        let rf = cfg
            .spec
            .kafka
            .replication_factor
            .unwrap_or(brokers.clamp(1, 3) as i32);
        create(cfg, &missing, rf)?;
        // Wait until the new topics show up in metadata with all their partitions.
        let deadline = Instant::now() + timeout;
        loop {
            let (now, _) = describe(cfg, timeout)?;
            if missing
                .iter()
                .all(|t| now.get(&t.name) == Some(&t.partitions))
            {
                counts = now;
                break;
            }
            if Instant::now() > deadline {
                return Err(TopicError::Create {
                    topic: missing[0].name.clone(),
                    code: RDKafkaErrorCode::OperationTimedOut,
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    for t in &internal {
        counts.insert(t.name.clone(), t.partitions);
    }
    let written: Vec<&str> = cfg
        .topology
        .subtopologies
        .iter()
        .flat_map(|s| s.sinks.iter().map(|k| k.topic.as_str()))
        .chain(internal.iter().map(|t| t.name.as_str()))
        .collect();
    Ok(Topics {
        partitions: counts,
        limits: limits(cfg, &written)?,
    })
}

/// The configs of `topics` as the broker applies them (its defaults included), by name.
fn describe_configs(
    cfg: &WorkerConfig,
    topics: &[&str],
) -> Result<Vec<(String, rdkafka::admin::ConfigResource)>, TopicError> {
    use rdkafka::admin::ResourceSpecifier;
    let mut names: Vec<&str> = topics.to_vec();
    names.sort_unstable();
    names.dedup();
    let admin: AdminClient<DefaultClientContext> =
        cfg.client_config()
            .create()
            .map_err(|source| TopicError::Unreachable {
                servers: cfg.bootstrap_servers.clone(),
                cause: source,
            })?;
    let specs: Vec<ResourceSpecifier<'_>> =
        names.iter().map(|t| ResourceSpecifier::Topic(t)).collect();
    let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
    let results = block_on(admin.describe_configs(&specs, &opts))?.map_err(|source| {
        TopicError::Unreachable {
            servers: cfg.bootstrap_servers.clone(),
            cause: source,
        }
    })?;
    names
        .iter()
        .zip(results)
        .map(|(name, r)| {
            r.map(|res| (name.to_string(), res))
                .map_err(|code| TopicError::Configs {
                    topic: name.to_string(),
                    code,
                })
        })
        .collect()
}

/// How long each of `topics` keeps a tombstone once compaction has reached it
/// (`delete.retention.ms`, the broker's default included), for those whose `cleanup.policy`
/// includes `compact`; None for the others, where only whole segments go. Read when a store
/// is opened rather than once at start, so a lowered setting applies at the next open.
pub fn tombstone_retention(
    cfg: &WorkerConfig,
    topics: &[&str],
) -> Result<HashMap<String, Option<i64>>, TopicError> {
    Ok(describe_configs(cfg, topics)?
        .into_iter()
        .map(|(name, res)| {
            let get = |k: &str| res.get(k).and_then(|e| e.value.clone());
            let compacted = get("cleanup.policy").is_some_and(|p| p.contains("compact"));
            let retention = get("delete.retention.ms")
                .and_then(|v| v.parse::<i64>().ok())
                .unwrap_or(DEFAULT_DELETE_RETENTION_MS);
            (name, compacted.then_some(retention))
        })
        .collect())
}

/// The broker's default `delete.retention.ms` (a day), should a broker not report it.
const DEFAULT_DELETE_RETENTION_MS: i64 = 86_400_000;

/// The record limits of `topics`, from their configs.
pub fn limits(
    cfg: &WorkerConfig,
    topics: &[&str],
) -> Result<HashMap<String, TopicLimits>, TopicError> {
    let results = describe_configs(cfg, topics)?;
    // The producer's own compression setting applies to every topic it writes.
    let producer_compresses = cfg
        .spec
        .kafka
        .properties
        .iter()
        .any(|(k, v)| (k == "compression.type" || k == "compression.codec") && v != "none");
    let mut out = HashMap::new();
    for (name, res) in results {
        let get = |k: &str| res.get(k).and_then(|e| e.value.clone());
        let compression = get("compression.type").unwrap_or_default();
        out.insert(
            name,
            TopicLimits {
                max_message_bytes: get("max.message.bytes")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(1_048_588),
                compacted: get("cleanup.policy").is_some_and(|p| p.contains("compact")),
                compressed: producer_compresses
                    || !matches!(compression.as_str(), "" | "producer" | "uncompressed"),
                timestamp_bounds: (get("message.timestamp.type").as_deref()
                    != Some("LogAppendTime"))
                .then(|| {
                    let ms = |k: &str| get(k).and_then(|v| v.parse::<i64>().ok());
                    (
                        ms("message.timestamp.before.max.ms").unwrap_or(i64::MAX),
                        ms("message.timestamp.after.max.ms").unwrap_or(i64::MAX),
                    )
                }),
            },
        );
    }
    Ok(out)
}

/// Drive an admin client's future on this (the processing) thread.
fn block_on<F: std::future::Future>(f: F) -> Result<F::Output, TopicError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(TopicError::Runtime)?;
    Ok(rt.block_on(f))
}

fn create(cfg: &WorkerConfig, topics: &[&InternalTopic], rf: i32) -> Result<(), TopicError> {
    let admin: AdminClient<DefaultClientContext> =
        cfg.client_config()
            .create()
            .map_err(|source| TopicError::Unreachable {
                servers: cfg.bootstrap_servers.clone(),
                cause: source,
            })?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| {
            t.config.iter().fold(
                NewTopic::new(&t.name, t.partitions, TopicReplication::Fixed(rf)),
                |nt, (k, v)| nt.set(k, v),
            )
        })
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = block_on(admin.create_topics(&new, &opts))?.map_err(|e| TopicError::Create {
        topic: topics[0].name.clone(),
        code: e.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail),
    })?;
    for r in results {
        match r {
            Ok(name) => tracing::info!(topic = %name, "created internal topic"),
            // Another worker of the same app may have won the race.
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(TopicError::Create { topic, code }),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(timestamp_bounds: Option<(i64, i64)>) -> TopicLimits {
        TopicLimits {
            max_message_bytes: 1_048_588,
            compacted: false,
            compressed: false,
            timestamp_bounds,
        }
    }

    #[test]
    fn a_time_a_written_topic_refuses_is_named_with_its_setting() {
        let now = 1_800_000_000_000;
        let mut topics = Topics::default();
        topics
            .limits
            .insert("out".into(), limits(Some((i64::MAX, 3_600_000))));
        topics.limits.insert("appended".into(), limits(None));
        assert_eq!(topics.check_timestamp(now + 3_600_000, now), Ok(()));
        assert_eq!(topics.check_timestamp(0, now), Ok(()));
        let e = topics.check_timestamp(now + 3_600_001, now).unwrap_err();
        assert!(
            e.contains("out refuses it (message.timestamp.after.max.ms)"),
            "{e}"
        );
        topics
            .limits
            .insert("recent".into(), limits(Some((86_400_000, i64::MAX))));
        let e = topics.check_timestamp(now - 86_400_001, now).unwrap_err();
        assert!(
            e.contains("recent refuses it (message.timestamp.before.max.ms)"),
            "{e}"
        );
        assert_eq!(
            topics.check_timestamp(i64::MAX, i64::MAX),
            Ok(()),
            "no overflow"
        );
    }
}
