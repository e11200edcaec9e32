//! Changelog and other internal topics: which ones an app needs, with what partition counts
//! and configs, and creating those that are missing. A changelog has one partition per task
//! of its sub-topology and is compacted, so it holds the latest value of every key: restore
//! is a plain copy of it.

use crate::config::WorkerConfig;
use eddy_crds::topics;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use std::collections::HashMap;
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum TopicError {
    #[error("cannot reach Kafka at {servers}: {message}")]
    Unreachable { servers: String, message: String },
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
    #[error("cannot create topic {topic:?}: {message}")]
    Create { topic: String, message: String },
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
            source: s.source.topic.clone(),
            internal: s.source.internal,
            stores: s.stores.iter().map(|d| d.name.clone()).collect(),
        })
        .collect();
    let dead_letter = cfg.on_error == eddy_crds::OnError::DeadLetter;
    topics::plan(&cfg.application_id, &subs, dead_letter, |t| {
        external.get(t).copied()
    })
    .map(|(topics, _)| topics)
    .map_err(|topic| TopicError::Missing {
        topic,
        role: "the source of the topology",
    })
}

/// Partition counts of existing topics, and the number of brokers.
pub fn describe(
    cfg: &WorkerConfig,
    timeout: Duration,
) -> Result<(PartitionCounts, usize), TopicError> {
    let consumer: BaseConsumer =
        cfg.client_config()
            .create()
            .map_err(|e| TopicError::Unreachable {
                servers: cfg.bootstrap_servers.clone(),
                message: e.to_string(),
            })?;
    let md = consumer
        .fetch_metadata(None, timeout)
        .map_err(|e| TopicError::Unreachable {
            servers: cfg.bootstrap_servers.clone(),
            message: e.to_string(),
        })?;
    let counts = md
        .topics()
        .iter()
        .filter(|t| t.error().is_none() && !t.partitions().is_empty())
        .map(|t| (t.name().to_string(), t.partitions().len() as i32))
        .collect();
    Ok((counts, md.brokers().len()))
}

/// Make sure every topic the app uses exists with the right partition count, creating missing
/// internal topics. Returns the partition counts of all of them.
pub fn prepare(cfg: &WorkerConfig) -> Result<PartitionCounts, TopicError> {
    let timeout = Duration::from_secs(30);
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
                    message: "created but not visible in metadata after 30 s".into(),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    for t in &internal {
        counts.insert(t.name.clone(), t.partitions);
    }
    Ok(counts)
}

fn create(cfg: &WorkerConfig, topics: &[&InternalTopic], rf: i32) -> Result<(), TopicError> {
    let admin: AdminClient<DefaultClientContext> =
        cfg.client_config()
            .create()
            .map_err(|e| TopicError::Unreachable {
                servers: cfg.bootstrap_servers.clone(),
                message: e.to_string(),
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
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| TopicError::Create {
            topic: topics[0].name.clone(),
            message: e.to_string(),
        })?;
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results =
        rt.block_on(admin.create_topics(&new, &opts))
            .map_err(|e| TopicError::Create {
                topic: topics[0].name.clone(),
                message: e.to_string(),
            })?;
    for r in results {
        match r {
            Ok(name) => tracing::info!(topic = %name, "created internal topic"),
            // Another worker of the same app may have won the race.
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => {
                return Err(TopicError::Create {
                    topic,
                    message: code.to_string(),
                });
            }
        }
    }
    Ok(())
}
