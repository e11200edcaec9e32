//! The application spec: the `spec` of a `StatefulStreamApp`, and the whole input of
//! `eddy-worker run`. One type serves both, so a file that runs on a laptop runs on Kubernetes.

use crate::step::Step;
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
    category = "eddy",
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
        name = "Progress",
        type_ = "string",
        json_path = ".status.progress",
        description = "what the operator is doing: ScalingOut, Draining, WarmingUp, FailingOver, RollingUpdate 1/3, Restoring, Stable, ..."
    ),
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
    /// Number of worker pods (default 1). Operator only: a standalone worker owns every task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Worker container image (default the operator's `--worker-image`: the chart's
    /// `workerImage`, else `ghcr.io/eddy-dev/eddy-worker:<the operator's version>`). Operator
    /// only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Kafka Streams' `application.id`: prefix of internal topics, transactional ids and the
    /// consumer group (default `<namespace>.<name>` under the operator, unique in the cluster;
    /// the name in a standalone file). An id another app already uses is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub application_id: Option<String>,
    /// How to reach Kafka: bootstrap servers, TLS and SASL from Secrets, client properties.
    #[serde(default)]
    pub kafka: KafkaSpec,
    /// `at_least_once` (default) or `exactly_once` (Kafka transactions, one transactional
    /// id per task; outputs read `read_committed` see every input's effect exactly once).
    #[serde(default)]
    pub processing_guarantee: ProcessingGuarantee,
    /// Milliseconds between commits (default 30000 at-least-once, 100 exactly-once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_interval_ms: Option<u64>,
    /// Exactly-once: how long a transaction may stay open before the brokers abort it
    /// (default 30000), the producer's `transaction.timeout.ms`. Must be at least twice
    /// `commitIntervalMs`, and at most the brokers' `transaction.max.timeout.ms` (900000 by
    /// default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transaction_timeout_ms: Option<u64>,
    /// Standby replicas per stateful task (default 0): copies of its stores kept up to date
    /// on other pods, where the task fails over to without a full restore. Operator only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_standby_replicas: Option<i32>,
    /// How tasks move to a pod that lacks their state (scale-out, scale-in, rebalancing).
    /// Operator only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup: Option<WarmupSpec>,
    /// The state volume of each worker pod (a PersistentVolumeClaim per pod). Operator only:
    /// a standalone worker uses `--state-dir`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<StorageSpec>,
    /// Memory for state per process: RocksDB block cache and memtables plus the record cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemorySpec>,
    /// What to do with a record that cannot be decoded or whose expression fails.
    #[serde(default)]
    pub on_error: OnError,
    /// Milliseconds one evaluation of a jq expression may take on one record (default 1000).
    /// A record that makes an expression run longer (say, a loop its data never ends) fails,
    /// and `onError` decides what happens to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expression_timeout_ms: Option<u64>,
    /// Milliseconds the processing thread may make no progress before the worker's `/healthz`
    /// fails, so that Kubernetes restarts the pod (default 300000). Must exceed every
    /// legitimate pause (a long commit, a restore batch, waiting for Kafka) and
    /// `expressionTimeoutMs`; at least 10000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness_timeout_ms: Option<u64>,
    /// CPU and memory of each worker container. Operator only (the worker's own state memory
    /// is `memory`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<k8s_openapi::api::core::v1::ResourceRequirements>,
    /// Merged into the worker pods' template like a strategic merge patch: `containers` and
    /// `initContainers` merge by `name` (the `worker` container keeps its own settings and
    /// gains what you add; env merges by `name`, volumeMounts by `mountPath`, ports by
    /// `containerPort`; other containers, e.g. sidecars, are added), `volumes` merge by
    /// `name`, maps merge recursively (`null` removes a key), other lists replace. Operator
    /// only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "open_object")]
    pub pod_template: Option<serde_json::Value>,
    /// What happens to the app's internal topics (changelogs, repartition, dead letters)
    /// when the resource is deleted. Operator only.
    #[serde(default)]
    pub cleanup_policy: CleanupPolicy,
    /// The workers' query API (interactive queries): read the app's stores over HTTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queries: Option<QueriesSpec>,
    /// Tables materialized from topics, by name, for `join` steps to look up (Kafka Streams'
    /// `KTable` and, with `global: true`, `GlobalKTable`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub tables: std::collections::BTreeMap<String, crate::table::TableSpec>,
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

/// A key of a Secret in the app's namespace. Written as in a Pod's env,
/// `{secretKeyRef: {name, key}}`, or shorter `{name, key}`; always serialized short.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SecretKeyRef {
    pub name: String,
    pub key: String,
}

const SECRET_KEY_REF_SHAPE: &str =
    "a Secret key: {secretKeyRef: {name: <secret>, key: <key>}} or {name: <secret>, key: <key>}";

impl<'de> Deserialize<'de> for SecretKeyRef {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match d.deserialize_any(SourceVisitor {
            value_allowed: false,
        })? {
            ValueSource::Secret(r) => Ok(r),
            ValueSource::Value(_) => Err(serde::de::Error::custom(format!(
                "expected {SECRET_KEY_REF_SHAPE}"
            ))),
        }
    }
}

/// Reads `{name, key}`, `{secretKeyRef: {name, key}}` and, where allowed, the value itself.
/// A visitor rather than an untagged enum, so errors carry the field's path; and messages
/// never repeat the value given (it may be a password written where it does not belong).
struct SourceVisitor {
    value_allowed: bool,
}

impl SourceVisitor {
    fn not_a_value<E: serde::de::Error>(&self) -> E {
        E::custom(format!(
            "expected {SECRET_KEY_REF_SHAPE}, not a value: the value belongs in a Secret"
        ))
    }
}

impl<'de> serde::de::Visitor<'de> for SourceVisitor {
    type Value = ValueSource;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.value_allowed {
            write!(f, "the value itself (a string) or ")?;
        }
        f.write_str(SECRET_KEY_REF_SHAPE)
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ValueSource, E> {
        if self.value_allowed {
            Ok(ValueSource::Value(v.to_string()))
        } else {
            Err(self.not_a_value())
        }
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<ValueSource, E> {
        self.visit_str(&v.to_string())
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ValueSource, E> {
        self.visit_str(&v.to_string())
    }

    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<ValueSource, E> {
        Err(self.not_a_value())
    }

    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<ValueSource, E> {
        Err(self.not_a_value())
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<ValueSource, A::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Short {
            name: String,
            key: String,
        }
        let (mut name, mut key, mut nested) = (None, None, None);
        while let Some(k) = map.next_key::<String>()? {
            match k.as_str() {
                "name" => name = Some(map.next_value::<String>()?),
                "key" => key = Some(map.next_value::<String>()?),
                "secretKeyRef" => nested = Some(map.next_value::<Short>()?),
                other => {
                    return Err(serde::de::Error::custom(format!(
                        "unknown field `{other}`, expected {SECRET_KEY_REF_SHAPE}"
                    )));
                }
            }
        }
        match (name, key, nested) {
            (Some(name), Some(key), None) | (None, None, Some(Short { name, key })) => {
                Ok(ValueSource::Secret(SecretKeyRef { name, key }))
            }
            _ => Err(serde::de::Error::custom(format!(
                "expected {SECRET_KEY_REF_SHAPE}"
            ))),
        }
    }
}

impl JsonSchema for SecretKeyRef {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "SecretKeyRef".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        secret_key_ref_schema()
    }
}

fn secret_key_ref_schema() -> schemars::Schema {
    let name = serde_json::json!({"type": "string", "minLength": 1, "description": "Name of a Secret in the app's namespace."});
    let key =
        serde_json::json!({"type": "string", "minLength": 1, "description": "Key in the Secret."});
    schemars::json_schema!({
        "type": "object",
        "description": "A key of a Secret in the app's namespace: {secretKeyRef: {name, key}} or {name, key}.",
        "properties": {
            "name": name,
            "key": key,
            "secretKeyRef": {"type": "object", "description": "The Secret's name and key, written as in a Pod's env.", "required": ["name", "key"], "properties": {"name": name, "key": key}},
        },
        "x-kubernetes-validations": [{
            "rule": "has(self.secretKeyRef) ? !has(self.name) && !has(self.key) : has(self.name) && has(self.key)",
            "message": "a Secret key is {secretKeyRef: {name: <secret>, key: <key>}} or {name: <secret>, key: <key>}",
        }],
    })
}

/// A value written in the spec, or read from a key of a Secret in the app's namespace:
/// `alice`, `{secretKeyRef: {name, key}}` or `{name, key}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ValueSource {
    Value(String),
    Secret(SecretKeyRef),
}

impl Default for ValueSource {
    fn default() -> Self {
        ValueSource::Value(String::new())
    }
}

impl Serialize for ValueSource {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ValueSource::Value(v) => s.serialize_str(v),
            ValueSource::Secret(r) => r.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for ValueSource {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SourceVisitor {
            value_allowed: true,
        })
    }
}

impl JsonSchema for ValueSource {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ValueSource".into()
    }
    // A string or an object is not a structural schema: the field is left open for the API
    // server and checked where the app is read (the operator, the worker).
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "x-kubernetes-preserve-unknown-fields": true,
            "description": "The value itself (a string), or a Secret key: {secretKeyRef: {name, key}} or {name, key}.",
        })
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TlsSpec {
    /// CA certificate (PEM) that signed the brokers' certificates (default: the system's CAs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<SecretKeyRef>,
    /// Client certificate (PEM) for mutual TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<SecretKeyRef>,
    /// Client private key (PEM) for mutual TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<SecretKeyRef>,
    /// Password of the client private key, if it is encrypted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_password: Option<SecretKeyRef>,
}

/// SASL mechanisms that authenticate with a username and a password.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum SaslMechanism {
    #[default]
    #[serde(rename = "PLAIN")]
    Plain,
    #[serde(rename = "SCRAM-SHA-256")]
    ScramSha256,
    #[serde(rename = "SCRAM-SHA-512")]
    ScramSha512,
}

impl SaslMechanism {
    /// The name Kafka and librdkafka use.
    pub fn as_str(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SaslSpec {
    /// `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    pub mechanism: SaslMechanism,
    /// The username itself, or a Secret key holding it.
    pub username: ValueSource,
    /// A Secret key holding the password.
    pub password: SecretKeyRef,
    /// Allow `PLAIN` without TLS, which sends the password to the brokers in clear (anyone on
    /// the network path reads it). Refused otherwise: add `kafka.tls`, or use SCRAM.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub send_password_in_clear: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KafkaSpec {
    /// Comma-separated `host:port` list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_servers: Option<String>,
    /// Replication factor of internal topics (default min(3, number of brokers)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication_factor: Option<i32>,
    /// Extra librdkafka client properties, applied to every client (eddy's own clients and
    /// the operator's). No credentials: they would be stored in the app's ConfigMap; use
    /// `tls` and `sasl`, which read them from Secrets.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub properties: std::collections::BTreeMap<String, String>,
    /// TLS to the brokers, with certificates and keys from Secrets (operator: mounted into the
    /// pods, and read in memory by the operator's own admin client).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpec>,
    /// SASL authentication, the password from a Secret (operator: passed to the pods as
    /// environment from the Secret, and read in memory by the operator's own admin client).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sasl: Option<SaslSpec>,
}

/// Default `transactionTimeoutMs`.
pub const DEFAULT_TRANSACTION_TIMEOUT_MS: u64 = 30_000;
/// The brokers' default `transaction.max.timeout.ms`: a larger transaction timeout is refused.
pub const MAX_TRANSACTION_TIMEOUT_MS: u64 = 900_000;

impl AppSpec {
    /// `commitIntervalMs` with its default for the processing guarantee.
    pub fn commit_interval_ms(&self) -> u64 {
        self.commit_interval_ms
            .unwrap_or(match self.processing_guarantee {
                ProcessingGuarantee::AtLeastOnce => 30_000,
                ProcessingGuarantee::ExactlyOnce => 100,
            })
    }

    /// `transactionTimeoutMs` with its default.
    pub fn transaction_timeout_ms(&self) -> u64 {
        self.transaction_timeout_ms
            .unwrap_or(DEFAULT_TRANSACTION_TIMEOUT_MS)
    }
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
pub struct QueriesSpec {
    /// Serve the query API on every worker, with a `<name>-query` Service in front (default
    /// true). Off: no Service, and the workers answer no query.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Who may reach the query port besides the app's own pods (they forward to each other),
    /// as a NetworkPolicy's `from` peers: e.g. `[{podSelector: {matchLabels: {role: web}}}]`.
    /// The operator makes a NetworkPolicy `<name>-query` admitting only them to port 9091 of
    /// the app's pods (every other port stays open). Empty: only the app's own pods. Operator
    /// only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from: Vec<k8s_openapi::api::networking::v1::NetworkPolicyPeer>,
    /// Answer queries without a credential (default false): anyone who reaches the query port
    /// reads every store. Off, a request needs a bearer token the Kubernetes API server
    /// accepts, allowed `get` on `statefulstreamapps/query` of this app (docs/queries.md,
    /// "Who may query"). A standalone worker, which has no API server to ask, serves a
    /// non-loopback address only with this set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anonymous: Option<bool>,
}

impl AppSpec {
    /// The workers serve queries (`spec.queries.enabled`, default true).
    pub fn queries_enabled(&self) -> bool {
        self.queries
            .as_ref()
            .and_then(|q| q.enabled)
            .unwrap_or(true)
    }

    /// Queries need no credential (`spec.queries.anonymous`, default false).
    pub fn queries_anonymous(&self) -> bool {
        self.queries
            .as_ref()
            .and_then(|q| q.anonymous)
            .unwrap_or(false)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WarmupSpec {
    /// Warm-up replicas at once across the app (default 2); at least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_warmup_replicas: Option<i32>,
    /// A task moves to its new pod once that pod's copy lacks at most this many changelog
    /// records (default 10000); at least 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acceptable_recovery_lag: Option<i64>,
}

impl WarmupSpec {
    pub const DEFAULT_MAX_WARMUP_REPLICAS: i32 = 2;
    pub const DEFAULT_ACCEPTABLE_RECOVERY_LAG: i64 = 10_000;
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StorageSpec {
    /// Size of each pod's state volume, e.g. `10Gi` (default `1Gi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<crate::Quantity>,
    /// StorageClass of the state volumes (default: the cluster's default class).
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
    /// Total state memory per process (default `256Mi`; a Kubernetes quantity: `1.5Gi`,
    /// `512Mi`, `1e9`): a quarter for the record cache, the rest for RocksDB's shared block
    /// cache, which also accounts memtables. Under the operator, worker pods get a memory
    /// request and limit derived from it unless `resources` (or the worker container in
    /// `podTemplate`) sets their own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<crate::Quantity>,
    /// Bytes of the record cache out of the budget (default a quarter of it). `0` turns caching
    /// off: every update goes to the changelog and downstream at once (Kafka Streams'
    /// `statestore.cache.max.bytes=0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_cache: Option<crate::Quantity>,
}

/// A process's state memory, in bytes: what [`AppSpec::memory_bytes`] reads from `memory`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryBytes {
    /// `memory.budget`: RocksDB's block cache and the record cache together.
    pub budget: u64,
    /// `memory.recordCache`.
    pub record_cache: u64,
}

impl MemorySpec {
    /// `memory.budget` when not set.
    pub const DEFAULT_BUDGET: u64 = 256 << 20;
    /// The least budget a worker runs with.
    pub const MIN_BUDGET: u64 = 16 << 20;
}

impl AppSpec {
    /// The state memory of each worker process; Err names the field (under `memory.`) and
    /// says what is wrong with it.
    pub fn memory_bytes(&self) -> Result<MemoryBytes, (&'static str, String)> {
        let m = self.memory.clone().unwrap_or_default();
        let budget = match &m.budget {
            Some(q) => q.bytes().map_err(|e| ("memory.budget", e.to_string()))?,
            None => MemorySpec::DEFAULT_BUDGET,
        };
        if budget < MemorySpec::MIN_BUDGET {
            return Err((
                "memory.budget",
                format!("{budget} bytes is too small: give at least 16Mi"),
            ));
        }
        let record_cache = match &m.record_cache {
            Some(q) => q
                .bytes()
                .map_err(|e| ("memory.recordCache", e.to_string()))?,
            None => budget / 4,
        };
        if record_cache > budget / 2 {
            return Err((
                "memory.recordCache",
                format!(
                    "{record_cache} bytes is more than half of memory.budget ({budget}): raise the budget or lower the cache"
                ),
            ));
        }
        Ok(MemoryBytes {
            budget,
            record_cache,
        })
    }
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

/// Any JSON object, kept as written (the pod template override).
fn open_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
}
