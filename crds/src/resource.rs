//! The `StatefulStreamApp` custom resource (group `eddy.dev`, version `v1alpha1`): the app
//! spec as the resource's spec, and the status the operator and the workers write.

pub use crate::spec::StatefulStreamApp;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::BTreeMap;

pub use crate::task::{TaskRole, TaskState};

/// What the operator and the workers report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppStatus {
    /// The `metadata.generation` of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Pending (workers not all running their tasks yet), Restoring (records left to
    /// restore), Running, or Degraded (see the `Degraded` condition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// `Ready`, `Progressing` (what the assignor is doing) and `Degraded` (what is wrong),
    /// each with a reason and a message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Worker pods the StatefulSet should run (`spec.replicas`, or more while draining).
    #[serde(default)]
    pub replicas: i32,
    /// Worker pods that are Ready.
    #[serde(default)]
    pub ready_replicas: i32,
    /// `readyReplicas/replicas`, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<String>,
    /// The `Progressing` condition's reason, with the pods done during a rolling update
    /// (`RollingUpdate 2/3`), for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// Label selector of the pods, for the scale subresource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Which pod runs which task: written by the operator, followed by the workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignment: Option<Assignment>,
    /// Each worker's own report, keyed by pod name (each worker owns its entry).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub workers: BTreeMap<String, WorkerStatus>,
    /// Total changelog records left to restore across all workers.
    #[serde(default)]
    pub backlog: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Phase {
    Pending,
    Restoring,
    Running,
    Degraded,
}

/// A Kubernetes-style condition: `Ready`, `Progressing`, `Degraded`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// `Ready`, `Progressing` or `Degraded`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// One word for machines and alerts, e.g. `ScalingOut`, `SourceTopicMissing`.
    pub reason: String,
    /// What is happening or wrong, and what to do, for people.
    pub message: String,
    /// RFC 3339 time the status last flipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    /// The `metadata.generation` the condition was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Tasks per pod. Sticky: a task stays where its state is.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Assignment {
    /// Increases whenever the placement changes; workers report the one they applied.
    pub generation: i64,
    /// Number of partitions per sub-topology, i.e. the tasks that exist.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partitions: Vec<i32>,
    /// Per pod name, the tasks it holds as active, standby and warm-up.
    pub pods: BTreeMap<String, PodTasks>,
    /// Pods the operator failed over (gone, terminating, not running, or silent): the new
    /// owners of their tasks do not wait for them to let go; under exactly-once they fence
    /// their transactional ids before taking over.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub down: Vec<String>,
}

/// A Kubernetes DNS label (RFC 1123), as names of namespaces and of a StatefulSet's pods
/// are: 1 to 63 lower-case letters, digits and `-`, starting and ending with a letter or digit.
pub fn is_dns_label(name: &str) -> bool {
    let b = name.as_bytes();
    (1..=63).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// Assignment generations the operator writes and a worker follows are below this: 2^53, the
/// largest integer every JSON reader holds exactly. One new generation a second would take
/// 285 million years to get there; a status beyond it was forged.
pub const MAX_GENERATION: i64 = 1 << 53;

/// How often a worker reports at the least, even when nothing changed: the operator takes a
/// worker whose report is much older ([`STALE_REPORT_SECONDS`]) for down.
pub const REPORT_HEARTBEAT_SECONDS: u64 = 5;
/// A worker report older than this (seconds) makes the operator fail the pod's tasks over.
/// Measured on the operator's own monotonic clock from when it first saw the report (not from
/// the report's `updated`, the worker's wall clock).
pub const STALE_REPORT_SECONDS: u64 = 30;
/// A worker's lease on its active tasks, in seconds. Under at-least-once, a worker that has
/// had no report acknowledged by the API server for this long (measured on its own clock from
/// when it sent that report) stops writing: it drops its tasks' uncommitted work and its
/// producer's queue before anyone may take them over. (Under exactly-once the new owner
/// fences it through its transactional id instead.)
///
/// Why the operator may fail a silent pod over [`STALE_REPORT_SECONDS`] after it first saw
/// its last report: the operator cannot see a report before the worker sent it, so the
/// operator-observed time of the last report is at or after the worker's send time of it.
/// Failing over 30 s after that observation is therefore at least 30 s after the send, and
/// at least 10 s after the worker's lease (20 s from the same send) ran out: the worker
/// stopped writing before a new owner starts, whatever the two clocks read (only their rates
/// must roughly agree). A later report the operator has not seen yet (its watch lags) would
/// make its view too old: but a failover is published only by a status write conditioned on
/// the `updated` of the pod's report the operator decided from (a JSON Patch `test`), so a
/// report acknowledged since makes that write fail and the operator decides again from it.
pub const WORKER_LEASE_SECONDS: u64 = 20;
// The margin above: a worker's lease must run out well before the operator may fail it over.
const _: () = assert!(WORKER_LEASE_SECONDS + 10 <= STALE_REPORT_SECONDS);

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodTasks {
    /// Tasks this pod processes. A task is active on one pod at most.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub active: Vec<String>,
    /// Tasks whose stores this pod keeps up to date (`numStandbyReplicas`), never on the
    /// pod of the task's active.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub standby: Vec<String>,
    /// Tasks about to move here: kept up to date like standbys until caught up, then made
    /// active here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warmup: Vec<String>,
    /// The run of the pod's worker this entry was made for (its report's `incarnation`),
    /// once the operator has seen it report. A worker takes the tasks of an entry made for it
    /// only: a restarted one does not act on what was decided for its previous run while the
    /// operator may be failing that run over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incarnation: Option<String>,
}

/// One worker's report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerStatus {
    /// The assignment generation this worker runs.
    #[serde(default)]
    pub applied_generation: i64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    /// Per task id (`<sub-topology>_<partition>`), what this worker holds of it.
    pub tasks: BTreeMap<String, TaskStatus>,
    /// RFC 3339 time of the report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated: Option<String>,
    /// Which run of the worker process made the report (when it started, unique per pod):
    /// the operator names it in the assignment it makes for that run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incarnation: Option<String>,
    /// Why the worker is not processing right now, while it waits for something to come
    /// back (Kafka, disk space) and retries from its last commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<WorkerProblem>,
    /// Records of the global tables' topics this worker still reads before its tasks
    /// process (every worker holds every global table; the app's `backlog` counts these).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub global_backlog: i64,
    /// Where this worker answers queries (`host:port`); absent when its query API is switched
    /// off. Under the operator other workers forward to the pod's name in the headless
    /// Service instead: this only says that the pod serves queries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query_address: Option<String>,
    /// How long this worker goes on processing after SIGTERM while the operator moves its
    /// active tasks to caught-up copies on other pods (0: it stops at once). The operator
    /// treats its terminating pod as handing over from the moment it sees the deletion.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub handoff_seconds: u64,
    /// The worker was asked to stop (SIGTERM) and hands its active tasks over: it takes no
    /// new one, and stops once it holds none or its hand-off time is up. Its peers wait only
    /// for the tasks it reports active.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stopping: bool,
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// A worker waiting for something outside it to recover.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerProblem {
    /// `KafkaUnavailable`, `StateStoreUnavailable` or `ApiServerUnreachable`.
    pub reason: WorkerProblemReason,
    /// The last error, as the worker logged it.
    pub message: String,
    /// RFC 3339 time the problem was first seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum WorkerProblemReason {
    /// Brokers unreachable or not answering, a transaction aborted or fenced, records not
    /// delivered: the worker retries from its last commit.
    KafkaUnavailable,
    /// The state directory cannot be written (disk full, I/O error, locked by another
    /// process): the worker retries until it can.
    StateStoreUnavailable,
    /// Under at-least-once, the worker's reports stopped reaching the API server for
    /// `WORKER_LEASE_SECONDS`: it stopped writing, since the operator may be moving its tasks,
    /// and takes tasks again once a report goes through.
    ApiServerUnreachable,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskStatus {
    /// ACTIVE, STANDBY or WARMUP.
    #[serde(default)]
    pub role: TaskRole,
    /// CREATED, RESTORING, RUNNING, SUSPENDED or CLOSED.
    pub state: TaskState,
    /// Active tasks: changelog records left to restore before the task processes (the app's
    /// `backlog` sums these).
    #[serde(default)]
    pub restore_backlog: i64,
    /// Changelog records this copy of the task's stores lacks, summed over its stores: what
    /// the operator compares with `warmup.acceptableRecoveryLag` before moving a task here.
    /// 0 for a running active (it writes the changelogs); absent when not known yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag: Option<i64>,
}

/// Admission rules a structural schema cannot say, as CEL on the spec.
const SPEC_RULES: &[(&str, &str)] = &[
    (
        "!has(self.processingGuarantee) || self.processingGuarantee != 'exactly_once' || (has(self.commitIntervalMs) ? self.commitIntervalMs : 100) * 2 <= (has(self.transactionTimeoutMs) ? self.transactionTimeoutMs : 30000)",
        "under exactly_once, commitIntervalMs must be at most half of transactionTimeoutMs (default 30000): lower commitIntervalMs or raise transactionTimeoutMs",
    ),
    (
        "!has(self.transactionTimeoutMs) || (self.transactionTimeoutMs >= 1000 && self.transactionTimeoutMs <= 900000)",
        "transactionTimeoutMs must be between 1000 and 900000 (the brokers' default transaction.max.timeout.ms)",
    ),
    (
        "!has(self.kafka) || !has(self.kafka.properties) || !('transaction.timeout.ms' in self.kafka.properties)",
        "set spec.transactionTimeoutMs instead of kafka.properties transaction.timeout.ms: eddy checks it against commitIntervalMs",
    ),
    (
        "has(self.topology[0].from)",
        "topology[0] must be `from: {topic: ...}`: every app starts by reading a topic",
    ),
];

/// The CRD as installed: kube's generated schema plus the rules above, with the step list
/// made explicit so an unknown step is named in the rejection.
pub fn crd() -> CustomResourceDefinition {
    let mut v = serde_json::to_value(StatefulStreamApp::crd()).unwrap_or(Value::Null);
    let schema = &mut v["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let rules: Vec<Value> = SPEC_RULES
        .iter()
        .map(|(r, m)| json!({"rule": r, "message": m}))
        .collect();
    schema["x-kubernetes-validations"] = Value::Array(rules);
    for f in ["replicas", "numStandbyReplicas"] {
        schema["properties"][f]["minimum"] = json!(0);
    }
    schema["properties"]["replicas"]["maximum"] = json!(crate::manifest::MAX_REPLICAS);
    let warmup = &mut schema["properties"]["warmup"]["properties"];
    warmup["maxWarmupReplicas"]["minimum"] = json!(1);
    warmup["acceptableRecoveryLag"]["minimum"] = json!(0);
    schema["properties"]["kafka"]["properties"]["properties"] = kafka_properties_schema();
    // As `manifest::check_kafka` says, less what `kafka.properties` turn off (the operator
    // and the worker check those): no password in clear unless the app says so.
    schema["properties"]["kafka"]["x-kubernetes-validations"] = json!([{
        "rule": "!has(self.sasl) || self.sasl.mechanism != 'PLAIN' || has(self.tls) || (has(self.sasl.sendPasswordInClear) && self.sasl.sendPasswordInClear)",
        "message": "kafka.sasl.mechanism: PLAIN without TLS sends the password to the brokers in clear, for anyone on the network path to read: add kafka.tls, use SCRAM-SHA-512, or set kafka.sasl.sendPasswordInClear: true",
    }]);
    // A table's key and value are never windowed (the manifest refuses it, with a reason).
    let table = &mut schema["properties"]["tables"]["additionalProperties"]["properties"];
    for f in ["key", "value"] {
        if let Some(values) = table[f]["enum"].as_array_mut() {
            values.retain(|v| v != "windowed");
        }
    }
    schema["properties"]["queries"]["properties"]["from"]["maxItems"] = json!(64);
    // Kubernetes knows int32/int64 only; schemars writes Rust's unsigned widths.
    fix_formats(schema);
    let topology = &mut schema["properties"]["topology"];
    topology["minItems"] = json!(1);
    topology["maxItems"] = json!(64);
    topology["items"] = crate::step::schema();
    bound_status(
        &mut v["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"],
    );
    serde_json::from_value(v).unwrap_or_default()
}

/// The most tasks one pod's report or one list of the assignment may name. Far above any
/// app the status can hold: the API server stores an object of 1.5 MiB at most, about 15,000
/// task reports in all.
pub const MAX_STATUS_TASKS: u64 = 65_536;

/// Bounds on what the status may hold, so the chart's admission policy on worker writes
/// (CEL comparing old and new status) has a bounded cost, and a status cannot be inflated
/// past what the operator could have written: every pod name and report of an app is one of
/// its at most `MAX_REPLICAS` pods, a task id is `<sub-topology>_<partition>`, times are RFC 3339.
fn bound_status(status: &mut Value) {
    let replicas = json!(crate::manifest::MAX_REPLICAS);
    let p = &mut status["properties"];
    p["conditions"]["maxItems"] = json!(16);
    // One condition per type; server-side apply merges conditions by type.
    p["conditions"]["x-kubernetes-list-type"] = json!("map");
    p["conditions"]["x-kubernetes-list-map-keys"] = json!(["type"]);
    let a = &mut p["assignment"]["properties"];
    a["partitions"]["maxItems"] = json!(1024);
    a["down"]["maxItems"] = replicas.clone();
    a["down"]["items"]["maxLength"] = json!(253);
    a["pods"]["maxProperties"] = replicas.clone();
    let pod = &mut a["pods"]["additionalProperties"]["properties"];
    for list in ["active", "standby", "warmup"] {
        pod[list]["maxItems"] = json!(MAX_STATUS_TASKS);
        pod[list]["items"]["maxLength"] = json!(32);
    }
    pod["incarnation"]["maxLength"] = json!(64);
    p["workers"]["maxProperties"] = replicas;
    let w = &mut p["workers"]["additionalProperties"]["properties"];
    w["tasks"]["maxProperties"] = json!(MAX_STATUS_TASKS);
    w["updated"]["maxLength"] = json!(64);
    w["incarnation"]["maxLength"] = json!(64);
    w["queryAddress"]["maxLength"] = json!(512);
    w["problem"]["properties"]["since"]["maxLength"] = json!(64);
}

fn fix_formats(v: &mut Value) {
    match v {
        Value::Object(m) => {
            if let Some(f) = m.get_mut("format")
                && let Some(s) = f.as_str()
                && let Some(signed) = s.strip_prefix('u')
            {
                *f = json!(signed);
                m.insert("minimum".into(), json!(0));
            }
            m.values_mut().for_each(fix_formats);
        }
        Value::Array(a) => a.iter_mut().for_each(fix_formats),
        _ => {}
    }
}

/// `kafka.properties`: no credentials (they would be stored in the ConfigMap). Bounded, so
/// the rule's cost is too.
fn kafka_properties_schema() -> Value {
    let names: Vec<&str> = crate::security::CREDENTIAL_PROPERTIES
        .iter()
        .map(|(p, _)| *p)
        .collect();
    // A CEL rule refusing these keys.
    let refuse = |keys: &[&str]| {
        let list = keys
            .iter()
            .map(|p| format!("'{p}'"))
            .collect::<Vec<_>>()
            .join(", ");
        format!("self.all(k, !(k in [{list}]))")
    };
    json!({
        "type": "object",
        "description": "Extra librdkafka client properties, applied to every client. No credentials: use kafka.tls and kafka.sasl, which read them from Secrets.",
        "additionalProperties": {"type": "string"},
        "maxProperties": 128,
        "x-kubernetes-validations": [{
            "rule": refuse(&names),
            "message": format!(
                "kafka.properties must not hold credentials ({}): they would be stored in the app's ConfigMap; use kafka.sasl and kafka.tls, which read them from Secrets",
                names.join(", ")
            ),
        }, {
            "rule": refuse(crate::security::BROKER_PROPERTIES),
            "message": format!(
                "kafka.properties must not say where the brokers are ({}): use kafka.bootstrapServers",
                crate::security::BROKER_PROPERTIES.join(", ")
            ),
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `kubectl explain` has something to say about every field of the CRD.
    #[test]
    fn every_field_has_a_description() {
        fn walk(v: &Value, path: &str, missing: &mut Vec<String>) {
            for (name, field) in v["properties"].as_object().into_iter().flatten() {
                let here = format!("{path}.{name}");
                if field.get("description").is_none() {
                    missing.push(here.clone());
                }
                walk(field, &here, missing);
            }
            if let Some(items) = v.get("items") {
                walk(items, &format!("{path}[]"), missing);
            }
            if let Some(values) = v.get("additionalProperties").filter(|a| a.is_object()) {
                walk(values, &format!("{path}.*"), missing);
            }
        }
        let crd = serde_json::to_value(crd()).expect("serializable");
        let mut missing = Vec::new();
        walk(
            &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"],
            "",
            &mut missing,
        );
        // Kubernetes' own types (`resources`) and metadata are described by Kubernetes.
        missing.retain(|p| !p.starts_with(".spec.resources") && !p.starts_with(".metadata"));
        assert!(
            missing.is_empty(),
            "fields without a description: {missing:?}"
        );
    }

    #[test]
    fn the_committed_crd_is_the_generated_one() {
        let generated = serde_yaml::to_string(&crd()).expect("serializable");
        for copy in [
            "statefulstreamapp.yaml",
            "../charts/eddy-operator/crds/statefulstreamapp.yaml",
        ] {
            // The run-time value first: a warm target directory may hold this test compiled
            // in another clone.
            let dir = std::env::var("CARGO_MANIFEST_DIR")
                .unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
            let path = format!("{dir}/{copy}");
            let committed = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                committed == generated,
                "{copy} is stale: run `eddy-operator crd | tee crds/statefulstreamapp.yaml > charts/eddy-operator/crds/statefulstreamapp.yaml`"
            );
        }
    }

    #[test]
    fn crd_names_and_columns() {
        let c = crd();
        assert_eq!(c.spec.names.short_names, Some(vec!["ssapp".to_string()]));
        let v = &c.spec.versions[0];
        let cols: Vec<&str> = v
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(cols, ["Ready", "Phase", "Progress", "Backlog", "Age"]);
        assert!(
            v.subresources
                .as_ref()
                .is_some_and(|s| s.scale.is_some() && s.status.is_some())
        );
    }

    #[test]
    fn the_resource_reads_the_app_spec() {
        let app: StatefulStreamApp = serde_yaml::from_str(
            "apiVersion: eddy.dev/v1alpha1\nkind: StatefulStreamApp\nmetadata: {name: pv}\nspec:\n  replicas: 2\n  topology:\n    - from: {topic: a}\n    - groupBy: '.user'\n    - count: {store: c}\n",
        )
        .expect("valid");
        assert_eq!(app.spec.replicas, Some(2));
        assert_eq!(app.spec.topology.len(), 3);
    }
}
