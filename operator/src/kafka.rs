//! What the operator asks Kafka: partition counts of the app's topics (the number of tasks)
//! and creating or deleting its internal topics. librdkafka is blocking; calls run on the
//! blocking pool with short timeouts so an unreachable cluster delays only its own app.

use crate::reconcile::KafkaFacts;
use eddy_crds::AppSpec;
use eddy_crds::topics::{self, InternalTopic};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use std::collections::HashMap;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(5);

fn config(spec: &AppSpec) -> Result<ClientConfig, String> {
    let servers = spec
        .kafka
        .bootstrap_servers
        .clone()
        .ok_or("spec.kafka.bootstrapServers is missing: the operator needs it to plan tasks")?;
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", servers)
        .set("client.id", "eddy-operator");
    for (k, v) in &spec.kafka.properties {
        c.set(k, v);
    }
    Ok(c)
}

/// Partition counts of every topic, and broker count, or why Kafka could not be asked.
pub async fn facts(spec: &AppSpec) -> KafkaFacts {
    let spec = spec.clone();
    tokio::task::spawn_blocking(move || {
        let c: BaseConsumer = config(&spec)?.create().map_err(|e| e.to_string())?;
        let md = c.fetch_metadata(None, TIMEOUT).map_err(|e| {
            format!(
                "cannot reach Kafka at {}: {e}",
                spec.kafka.bootstrap_servers.as_deref().unwrap_or("?")
            )
        })?;
        let counts: HashMap<String, i32> = md
            .topics()
            .iter()
            .filter(|t| t.error().is_none() && !t.partitions().is_empty())
            .map(|t| (t.name().to_string(), t.partitions().len() as i32))
            .collect();
        Ok::<_, String>(counts)
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r)
    .map_or_else(KafkaFacts::Unreachable, KafkaFacts::Topics)
}

/// Create internal topics, replicated min(3, brokers) times unless the spec says otherwise.
pub async fn create_topics(spec: &AppSpec, topics: &[InternalTopic]) -> Result<(), String> {
    let s = spec.clone();
    let brokers = tokio::task::spawn_blocking(move || {
        let c: BaseConsumer = config(&s)?.create().map_err(|e| e.to_string())?;
        let md = c.fetch_metadata(None, TIMEOUT).map_err(|e| e.to_string())?;
        Ok::<_, String>(md.brokers().len() as i32)
    })
    .await
    .map_err(|e| e.to_string())??;
    let rf = spec.kafka.replication_factor.unwrap_or(brokers.clamp(1, 3));
    let admin: AdminClient<DefaultClientContext> =
        config(spec)?.create().map_err(|e| e.to_string())?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| {
            t.config.iter().fold(
                NewTopic::new(&t.name, t.partitions, TopicReplication::Fixed(rf)),
                |nt, (k, v)| nt.set(k, v),
            )
        })
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(TIMEOUT));
    let results = admin
        .create_topics(&new, &opts)
        .await
        .map_err(|e| e.to_string())?;
    for r in results {
        match r {
            Ok(name) => tracing::info!(topic = %name, "created internal topic"),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(format!("cannot create topic {topic:?}: {code}")),
        }
    }
    Ok(())
}

/// Names of every internal topic an app running under `app_id` may have, whether or not it
/// exists (`app_id` from `eddy_crds::manifest::application_id`, as everywhere).
pub async fn internal_topics(spec: &AppSpec, app_id: &str) -> Vec<String> {
    let layout = topics::layout(app_id, spec);
    let mut names: Vec<String> = layout
        .iter()
        .flat_map(|s| {
            let repartition = s.internal.then(|| s.source.clone());
            repartition
                .into_iter()
                .chain(s.stores.iter().map(|st| topics::changelog(app_id, st)))
        })
        .collect();
    names.push(topics::dead_letter(app_id));
    names
}

pub async fn delete_topics(spec: &AppSpec, names: &[String]) -> Result<(), String> {
    let admin: AdminClient<DefaultClientContext> =
        config(spec)?.create().map_err(|e| e.to_string())?;
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let results = admin
        .delete_topics(&refs, &AdminOptions::new().operation_timeout(Some(TIMEOUT)))
        .await
        .map_err(|e| e.to_string())?;
    for r in results {
        match r {
            Ok(name) => tracing::info!(topic = %name, "deleted internal topic"),
            Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
            Err((topic, code)) => return Err(format!("cannot delete topic {topic:?}: {code}")),
        }
    }
    Ok(())
}
