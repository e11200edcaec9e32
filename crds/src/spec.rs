//! The application spec: the `spec` of a `StatefulStreamApp`, and the whole input of
//! `eddy-worker run`. One type serves both, so a file that runs on a laptop runs on Kubernetes.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What a user writes to run a stateful stream application: the spec of a
/// `StatefulStreamApp`, and the whole input of `eddy-worker run`.
// kube's `printcolumn(...)` repeats `type_ = ...` keys by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "eddy.dev",
    version = "v1alpha1",
    kind = "StatefulStreamApp",
    namespaced,
    shortname = "ssapp",
    status = "crate::resource::AppStatus",
    doc = "A stateful stream application: a topology of Kafka Streams-style steps run by eddy-worker pods",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.ready",
        description = "ready pods / desired pods"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Backlog",
        type_ = "integer",
        json_path = ".status.backlog",
        description = "changelog records left to restore"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AppSpec {
    /// Number of worker pods (operator only; a standalone worker owns every task).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Worker container image (operator only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Kafka Streams' `application.id`: prefix of internal topics, transactional ids and the
    /// consumer group. Defaults to `<namespace>.<name>` under the operator (unique in the
    /// cluster), to the name in a standalone file. An id another app already uses is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub application_id: Option<String>,
    #[serde(default)]
    pub kafka: KafkaSpec,
    #[serde(default)]
    pub processing_guarantee: ProcessingGuarantee,
    /// Milliseconds between commits; default 30000 at-least-once, 100 exactly-once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_interval_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_standby_replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup: Option<WarmupSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<StorageSpec>,
    /// Memory for state per process: RocksDB block cache and memtables plus the record cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemorySpec>,
    /// What to do with a record that cannot be decoded or whose expression fails.
    #[serde(default)]
    pub on_error: OnError,
    /// CPU and memory of each worker container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<k8s_openapi::api::core::v1::ResourceRequirements>,
    /// Merged into the worker pods' template like a strategic merge patch: `containers` and
    /// `initContainers` merge by `name` (the `worker` container keeps its own settings and
    /// gains what you add; env merges by `name`, volumeMounts by `mountPath`, ports by
    /// `containerPort`; other containers, e.g. sidecars, are added), `volumes` merge by
    /// `name`, maps merge recursively (`null` removes a key), other lists replace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "open_object")]
    pub pod_template: Option<serde_json::Value>,
    /// What happens to the app's internal topics (changelogs, repartition, dead letters)
    /// when the resource is deleted.
    #[serde(default)]
    pub cleanup_policy: CleanupPolicy,
    /// The processing steps, in order: the first is `from`. Each step is a one-key map
    /// (`- filter: '.status == 200'`), as users write them, not a YAML tag.
    #[serde(with = "serde_yaml::with::singleton_map_recursive")]
    #[schemars(with = "Vec<Step>")]
    pub topology: Vec<Step>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum CleanupPolicy {
    /// Keep internal topics: a re-created app with the same id finds its state.
    #[default]
    Retain,
    /// Delete internal topics with the app.
    Delete,
}

/// A key of a Secret in the app's namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretKeyRef {
    pub name: String,
    pub key: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TlsSpec {
    /// CA certificate (PEM) that signed the brokers' certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<SecretKeyRef>,
    /// Client certificate and key (PEM) for mutual TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<SecretKeyRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<SecretKeyRef>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SaslSpec {
    /// `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    pub mechanism: String,
    pub username: SecretKeyRef,
    pub password: SecretKeyRef,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KafkaSpec {
    /// Comma-separated `host:port` list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_servers: Option<String>,
    /// Replication factor of internal topics; default min(3, number of brokers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication_factor: Option<i32>,
    /// Extra librdkafka client properties (e.g. `security.protocol`), applied to every client.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub properties: std::collections::BTreeMap<String, String>,
    /// TLS to the brokers, with certificates from Secrets (operator: mounted into the pods).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpec>,
    /// SASL credentials from Secrets (operator: passed to the pods as environment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sasl: Option<SaslSpec>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProcessingGuarantee {
    #[default]
    AtLeastOnce,
    ExactlyOnce,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WarmupSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_warmup_replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acceptable_recovery_lag: Option<i64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StorageSpec {
    /// Size of each pod's state volume, e.g. `10Gi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// Keep or delete a pod's volume when the app scales in (default Retain: scaling back
    /// out finds the state).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when_scaled: Option<CleanupPolicy>,
    /// Keep or delete the volumes when the app is deleted (default Delete).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when_deleted: Option<CleanupPolicy>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemorySpec {
    /// Total state memory per process, e.g. `256Mi` (default): a quarter for the record
    /// cache, the rest for RocksDB's shared block cache, which also accounts memtables.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<String>,
    /// Bytes of the record cache out of the budget (default a quarter). `0` turns caching
    /// off: every update goes to the changelog and downstream at once (Kafka Streams'
    /// `statestore.cache.max.bytes=0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_cache: Option<String>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum OnError {
    /// Stop the worker, naming topic, partition, offset and reason.
    #[default]
    Fail,
    /// Count the record in a metric and go on.
    Skip,
    /// Write the original bytes to `<applicationId>-dlq` with headers saying why, and go on.
    DeadLetter,
}

/// How the bytes of a key or value are read and written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// UTF-8 text; a jq string is written as its raw text, other values as JSON.
    String,
    /// JSON text.
    Json,
    /// Arbitrary bytes; seen by jq as an array of numbers 0..255.
    Bytes,
    /// 8-byte big-endian signed integer (Kafka's LongSerializer).
    I64,
}

/// One step of a topology. Expressions are jq: `.` is the record value, `$key` the key,
/// `$ts` the timestamp in ms and, in `aggregate.add`, `$agg` the current aggregate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Step {
    /// Read a topic: one task per partition.
    From(FromStep),
    /// Keep the records for which the expression is true.
    Filter(String),
    /// Replace the value by each output of the expression.
    Map(String),
    /// Re-key by the expression's output; inserts a repartition topic.
    GroupBy(GroupBy),
    /// Count records per key into a store; emits the updated count.
    Count(CountStep),
    /// Fold records per key into a store; emits the updated aggregate.
    Aggregate(AggregateStep),
    /// Write to a topic, partitioned by Kafka's murmur2 of the key bytes.
    To(ToStep),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FromStep {
    pub topic: String,
    #[serde(default = "default_key_format")]
    pub key: Format,
    #[serde(default = "default_value_format")]
    pub value: Format,
}

/// `groupBy: '.user'`, or `groupBy: {key: '.user', format: json}` to choose the key format.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum GroupBy {
    Expr(String),
    Full(GroupByStep),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GroupByStep {
    pub key: String,
    #[serde(default = "default_key_format")]
    pub format: Format,
}

impl GroupBy {
    pub fn expr(&self) -> &str {
        match self {
            GroupBy::Expr(e) => e,
            GroupBy::Full(s) => &s.key,
        }
    }
    pub fn format(&self) -> Format {
        match self {
            GroupBy::Expr(_) => Format::String,
            GroupBy::Full(s) => s.format,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CountStep {
    pub store: String,
    #[serde(default)]
    pub in_memory: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AggregateStep {
    pub store: String,
    /// jq expression for the first aggregate of a key (input is the record value).
    pub initial: String,
    /// jq expression for the new aggregate, with `$agg` bound to the current one.
    pub add: String,
    #[serde(default)]
    pub in_memory: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToStep {
    pub topic: String,
    /// Key format; default: the key's current format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<Format>,
    /// Value format; default: the value's current format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Format>,
}

fn default_key_format() -> Format {
    Format::String
}
fn default_value_format() -> Format {
    Format::Json
}

/// Any JSON object, kept as written (the pod template override).
fn open_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
}
