//! Interactive queries as they cross the wire: what a worker's query API answers (and what
//! one worker forwards to another), read by the worker, its `query` command and clients.

use crate::task::TaskRole;
use serde::{Deserialize, Serialize};

/// The port of the query API in a worker pod (metrics and probes stay on 9090, so that a
/// NetworkPolicy can open one without the other).
pub const QUERY_PORT: i32 = 9091;

/// The headless Service giving each worker pod of app `app` its DNS name.
pub fn workers_service(app: &str) -> String {
    format!("{app}-workers")
}

/// The ClusterIP Service clients send queries to (any worker answers any key).
pub fn query_service(app: &str) -> String {
    format!("{app}-query")
}

/// Where other workers reach pod `pod`'s query API: its name in the headless Service.
pub fn pod_query_address(app: &str, pod: &str, namespace: &str) -> String {
    format!(
        "{pod}.{}.{namespace}.svc:{QUERY_PORT}",
        workers_service(app)
    )
}

/// The changelog position a copy of a store reflects: it has applied every record of
/// `topic`'s partition `partition` before `offset` (the next one it would read).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Position {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

/// Which copy of a store answered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AnsweredBy {
    /// The worker (pod name) holding the copy.
    pub pod: String,
    /// The task whose shard of the store was read (`global` for a global table).
    pub task: String,
    /// ACTIVE, or STANDBY / WARMUP when the request accepted a lagging copy.
    pub role: TaskRole,
    /// Changelog records the copy lacked when it was read (0 for an active).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag: Option<i64>,
    /// Where in the changelog the copy stands; absent for a store not written yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<Position>,
}

/// A key or a window and its value, rendered in the store's formats.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    pub key: serde_json::Value,
    pub value: serde_json::Value,
    /// A window's or session's start (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<i64>,
    /// A window's end (exclusive) or a session's end (inclusive), in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<i64>,
    /// The time of the record that set the value (tables and windows keep it; a versioned
    /// store's version is valid from then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<i64>,
    /// Where the entry sorts among the store's (hex of its stored bytes): set on the answers
    /// one worker asks another for, to merge partitions in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<String>,
}

/// The answer to a single-key lookup.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyAnswer {
    pub store: String,
    pub key: serde_json::Value,
    /// False when the store has no value for the key (`value` is then null).
    pub found: bool,
    pub value: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<i64>,
    pub answered_by: AnsweredBy,
}

/// The answer to a range, a scan or a window fetch: one page.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RangeAnswer {
    pub store: String,
    pub entries: Vec<Entry>,
    /// Pass as `after` for the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// The copies read, one per partition the range spans.
    pub answered_by: Vec<AnsweredBy>,
}

/// What a store holds and how to ask it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoreDescription {
    pub name: String,
    /// `key-value`, `versioned`, `window`, `session` or `global`.
    pub kind: String,
    pub key_format: String,
    pub value_format: String,
    /// The changelog (a global table's topic) whose position answers carry.
    pub changelog: String,
    /// Partitions the store is split into (0 while not known yet).
    pub partitions: i32,
    /// Why it cannot be queried (the engine's own buffer), if so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_queryable: Option<String>,
}

/// The body of every error answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueryProblem {
    pub error: String,
    /// Set on 503 answers (also the `Retry-After` header): ask again after this many seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u64>,
}
