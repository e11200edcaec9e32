//! Tables (Kafka Streams' `KTable` and `GlobalKTable`): a topic read as the latest value per
//! key into a key-value store, which `join` steps look up.

use crate::duration::Duration;
use crate::step::Format;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `spec.tables.<name>`: a (compacted) topic materialized as a table. A record sets its
/// key's value, a tombstone (null value) deletes the key; records without a key are dropped.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TableSpec {
    /// The topic the table reads (it must exist). A table that is not global is partitioned
    /// like the streams that join it: same partition count, keys partitioned by murmur2.
    pub topic: String,
    /// Key format (default string).
    #[serde(default = "crate::step::default_key_format")]
    pub key: Format,
    /// Value format (default json).
    #[serde(default = "crate::step::default_value_format")]
    pub value: Format,
    /// The store the table is kept in (default: the table's name); a table that is not
    /// global has the changelog `<applicationId>-<store>-changelog`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    /// Every worker holds every partition (Kafka Streams' `GlobalKTable`): restored before
    /// processing starts and kept up to date from the topic, which is its changelog. For
    /// small reference tables looked up by any key.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub global: bool,
    /// Keep each key's history for this long, so that a stream-table join sees the value as
    /// of the stream record's time (Kafka Streams' versioned stores). Not for global tables
    /// or table-table joins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub versioned: Option<Versioned>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Versioned {
    /// How far back in time a lookup may see (Kafka Streams' history retention), e.g. `1d`,
    /// counted back from the table's stream time: the latest time of an update of any key in
    /// the partition. A lookup further back sees only a value set before it and not changed
    /// since (else nothing), and an update further back than this is dropped.
    pub history: Duration,
}

impl TableSpec {
    /// The table's store: `store`, else the table's name.
    pub fn store_name<'a>(&'a self, table: &'a str) -> &'a str {
        self.store.as_deref().unwrap_or(table)
    }

    /// A versioned table's history, ms (None: not versioned).
    pub fn history_ms(&self) -> Option<i64> {
        self.versioned.as_ref().map(|v| v.history.millis_i64())
    }
}
