//! The step vocabulary of a topology: what each step is called, what it takes, and how the
//! API server checks it. Described once here and read by the spec, validation
//! ([`crate::manifest`]), the layout of internal topics ([`crate::topics`]) and the worker.

use crate::duration::Duration;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

const STEPS: &str =
    "from, filter, map, groupBy, join, window, count, aggregate, reduce, suppress, to";

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
    /// A windowed key as Kafka Streams' windowed serdes write it: the inner key's bytes, then
    /// the window start as an 8-byte big-endian long (`TimeWindowedSerializer`). Only for
    /// `to.key` after a window.
    Windowed,
}

/// One step of a topology. Expressions are jq: `.` is the record value, `$key` the key,
/// `$ts` the timestamp in ms, in `aggregate.add` and `reduce.with` `$agg` the current
/// aggregate and, after a window, `$window` the record's window (`{start, end}`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Step {
    /// Read a topic: one task per partition.
    From(FromStep),
    /// Keep the records for which the expression is true.
    Filter(String),
    /// Replace the value by each output of the expression.
    Map(String),
    /// Re-key by the expression's output; inserts a repartition topic, named after the
    /// step's `name`, or its index when it has none.
    GroupBy(GroupBy),
    /// Join each record with a table's value for its key (`join: {table, as, type}`), or
    /// with another stream's records of its key within a time window (`join: {stream,
    /// within, as, type}`).
    Join(JoinStep),
    /// Make the next aggregation (`count`, `aggregate`, `reduce`) per key and time window.
    Window(WindowStep),
    /// Count records per key into a store; emits the updated count.
    Count(CountStep),
    /// Fold records per key into a store; emits the updated aggregate.
    Aggregate(AggregateStep),
    /// Combine records per key with an expression of the current value and the new one;
    /// emits the updated value.
    Reduce(ReduceStep),
    /// After a windowed aggregation: hold its updates back and emit one final result per
    /// window once the window closes.
    Suppress(Suppress),
    /// Write to a topic, partitioned by Kafka's murmur2 of the key bytes.
    To(ToStep),
}

impl Step {
    /// The step's key as users write it (`groupBy`), for messages.
    pub fn keyword(&self) -> &'static str {
        match self {
            Step::From(_) => "from",
            Step::Filter(_) => "filter",
            Step::Map(_) => "map",
            Step::GroupBy(_) => "groupBy",
            Step::Join(_) => "join",
            Step::Window(_) => "window",
            Step::Count(_) => "count",
            Step::Aggregate(_) => "aggregate",
            Step::Reduce(_) => "reduce",
            Step::Suppress(_) => "suppress",
            Step::To(_) => "to",
        }
    }
}

/// `from: {topic: orders}` reads a stream; `from: {table: customers}` reads a table of
/// `spec.tables` (Kafka Streams' `builder.table`): its updates, for a table-table join.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FromStep {
    /// The stream's topic (or `table`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub topic: String,
    /// A table of `spec.tables` (or `topic`): the topology reads its updates, each key's
    /// latest value kept in the table's store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<String>,
    /// The key's format (default `string`); a table's are set in `tables`. Written out with
    /// its default, as before it was optional: the operator's ConfigMaps and the pods' spec
    /// hash stay what they were.
    #[serde(default, serialize_with = "key_or_default")]
    pub key: Option<Format>,
    /// The value's format (default `json`); a table's are set in `tables`.
    #[serde(default, serialize_with = "value_or_default")]
    pub value: Option<Format>,
    /// jq: the record's event time in milliseconds since the epoch, from its value (default:
    /// the Kafka record's timestamp). Windows and stream time follow it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
}

fn key_or_default<S: serde::Serializer>(f: &Option<Format>, s: S) -> Result<S::Ok, S::Error> {
    f.unwrap_or_else(default_key_format).serialize(s)
}

fn value_or_default<S: serde::Serializer>(f: &Option<Format>, s: S) -> Result<S::Ok, S::Error> {
    f.unwrap_or_else(default_value_format).serialize(s)
}

impl FromStep {
    /// The stream's key format, `string` unless given.
    pub fn key_format(&self) -> Format {
        self.key.unwrap_or_else(default_key_format)
    }

    /// The stream's value format, `json` unless given.
    pub fn value_format(&self) -> Format {
        self.value.unwrap_or_else(default_value_format)
    }
}

/// `groupBy: '.user'`, or `groupBy: {key: '.user', format: json, name: by-user}` to choose
/// the key format or name the step.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
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
    /// Names the repartition topic `<applicationId>-<name>-repartition`, so it keeps its name
    /// when steps are inserted or removed around this one (as Kafka Streams' `Grouped.as`).
    /// Default: the step's index, `<applicationId>-<index>-repartition`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "name_or_index"
    )]
    pub name: Option<String>,
}

/// A step name; a number is read as its digits, so `name: 2` (which keeps the topic an
/// unnamed step at index 2 wrote) means the same in a YAML file and in the cluster's JSON.
fn name_or_index<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = String;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a name (ASCII letters, digits, '.', '_', '-')")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<String, E> {
            Ok(v.to_string())
        }
    }
    d.deserialize_any(V).map(Some)
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
    /// The step's `name`, if it has one.
    pub fn name(&self) -> Option<&str> {
        match self {
            GroupBy::Expr(_) => None,
            GroupBy::Full(s) => s.name.as_deref(),
        }
    }
}

// By hand rather than `untagged`: an untagged enum reports any mistake in the object form as
// "data did not match any variant", where this names the unknown or mistyped field.
impl<'de> Deserialize<'de> for GroupBy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = GroupBy;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a jq expression, or {key: <jq>, format: FORMAT, name: NAME}")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<GroupBy, E> {
                Ok(GroupBy::Expr(v.to_string()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, m: A) -> Result<GroupBy, A::Error> {
                GroupByStep::deserialize(serde::de::value::MapAccessDeserializer::new(m))
                    .map(GroupBy::Full)
            }
        }
        d.deserialize_any(V)
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
    /// Session windows only: jq expression for the aggregate of two sessions a record
    /// bridges, with `$agg` and `$other` their aggregates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge: Option<String>,
    #[serde(default)]
    pub in_memory: bool,
}

/// `join: {table: customers, as: '{order: ., customer: $right}', type: left}`: a stream-table
/// join (Kafka Streams' `KStream#join`/`leftJoin` with a `KTable` or `GlobalKTable`). Each
/// record looks up the table by its key (a global table by `key`); the record goes on with
/// the value `as` gives, its key and timestamp unchanged. Table updates emit nothing.
///
/// `join: {stream: {topic: shipments}, within: 5m, grace: 1m, as: ..., type: left}`: a
/// windowed stream-stream join (Kafka Streams' `KStream#join`/`leftJoin`/`outerJoin` with
/// `JoinWindows`): records of both streams with the same key at most `within` apart meet,
/// whichever comes first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JoinStep {
    /// A table of `spec.tables` (or `stream`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<String>,
    /// The other stream of a stream-stream join (or `table`): co-partitioned with this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<JoinStream>,
    /// Global tables only: jq giving the lookup key from the record (`.` the value, `$key`
    /// the key; default the record's key). A record whose lookup key is null is dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Stream joins (and required there): how far apart in event time, either way, two
    /// records may be and still join (Kafka Streams' `JoinWindows.ofTimeDifference`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub within: Option<Duration>,
    /// Stream joins: how long after its window ends (in stream time) a left or outer join
    /// waits for a partner before it emits a record unjoined; also how long records are kept
    /// beyond the window (default 0s: Kafka Streams' `ofTimeDifferenceWithNoGrace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace: Option<Duration>,
    /// Stream joins: names its stores `<store>-left`, `<store>-right` (each side's records
    /// within the window) and, for left and outer joins, `<store>-outer` (records waiting
    /// for a partner). Default `join-<step index>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    /// jq: the joined value, with `.` the record's value and `$right` the other side's
    /// (`null` when a `left` or `outer` join finds nothing; in an `outer` join `.` is null
    /// for a right record nothing joined).
    #[serde(rename = "as")]
    pub as_: String,
    /// `inner` (default): records nothing joins are dropped; `left`: they go on with
    /// `$right` null; `outer` (stream and table-table joins): so do the other side's, with
    /// `.` null.
    #[serde(default, rename = "type")]
    pub kind: JoinType,
    /// Table-table joins: also keep the joined table in this store (changelogged), as Kafka
    /// Streams' `Materialized.as`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub materialize: Option<Materialize>,
}

/// Where a table-table join keeps its result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Materialize {
    pub store: String,
}

/// The other stream of a stream-stream join.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JoinStream {
    pub topic: String,
    #[serde(default = "default_key_format")]
    pub key: Format,
    #[serde(default = "default_value_format")]
    pub value: Format,
    /// jq: the record's event time in ms since the epoch, from its value (default: the Kafka
    /// record's timestamp), as `from.timestamp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
}

impl JoinStep {
    /// A stream join's stores: its name prefix (`store`, default `join-<step>`).
    pub fn store_prefix(&self, step: usize) -> String {
        self.store.clone().unwrap_or_else(|| format!("join-{step}"))
    }

    /// How long a stream join keeps each side's records: the window both ways plus grace
    /// (Kafka Streams' `JoinWindows.size() + gracePeriodMs()`).
    pub fn retention(&self) -> Duration {
        let within = self.within.unwrap_or(Duration::ZERO);
        within
            .saturating_add(within)
            .saturating_add(self.grace.unwrap_or(Duration::ZERO))
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum JoinType {
    #[default]
    Inner,
    Left,
    Outer,
}

/// `suppress: untilWindowCloses` (Kafka Streams' `Suppressed.untilWindowCloses`): one result
/// per window, its final value, once stream time passes the window's end plus its grace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Suppress {
    UntilWindowCloses,
}

/// The store a `suppress` step buffers its windows in: named after the aggregation's store.
pub fn suppress_store(aggregation_store: &str) -> String {
    format!("{aggregation_store}-suppress")
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReduceStep {
    pub store: String,
    /// jq expression for the new value: `.` is the record's value, `$agg` the current one.
    /// The first value of a key is stored as it is.
    pub with: String,
    #[serde(default)]
    pub in_memory: bool,
}

/// `window: {tumbling: 5m, grace: 30s}`, `{hopping: 1h, advance: 5m, grace: 0s}`,
/// `{sliding: 10m, grace: 1m}` or `{session: 30m, grace: 1m}`: exactly one kind, with its
/// grace period.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WindowStep {
    /// Fixed windows of this size, one after the other (Kafka Streams' `TimeWindows` with
    /// advance = size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tumbling: Option<Duration>,
    /// Fixed windows of this size that start every `advance`, so a record is in several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hopping: Option<Duration>,
    /// How far apart hopping windows start: more than 0, at most their size, and at least
    /// a 10000th of it (`MAX_HOPPING_WINDOWS`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advance: Option<Duration>,
    /// Windows of this size ending at each record (Kafka Streams' `SlidingWindows`, whose
    /// time difference this is): records in one window are at most this far apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding: Option<Duration>,
    /// Sessions: a key's records with gaps of at most this inactivity gap between them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<Duration>,
    /// How late (in event time, behind the largest timestamp the task has seen) a record may
    /// arrive and still count in its window: `0s` drops every late record. Required, as Kafka
    /// Streams asks to choose between `ofSizeWithNoGrace` and `ofSizeAndGrace`.
    pub grace: Duration,
    /// How long windows are kept in the store: at least, and by default, as long as records
    /// may still change them (as Kafka Streams: size + grace; twice the size + grace for
    /// sliding windows; gap + grace for sessions). Longer keeps history to query.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<Duration>,
}

/// A window step's kind, read from its fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowKind {
    Tumbling { size: Duration },
    Hopping { size: Duration, advance: Duration },
    Sliding { size: Duration },
    Session { gap: Duration },
}

/// Most hopping windows a record may fall into (size / advance): every one is a store update
/// and an output record per input record, so `{hopping: 1d, advance: 1ms}` would stall a task.
pub const MAX_HOPPING_WINDOWS: u64 = 10_000;

const KINDS: &str = "{tumbling: 5m, grace: 30s}, {hopping: 1h, advance: 5m, grace: 0s}, {sliding: 10m, grace: 1m} or {session: 30m, grace: 1m}";

impl WindowStep {
    /// Exactly one kind, and its sizes make sense.
    pub fn kind(&self) -> Result<WindowKind, String> {
        let given: Vec<&str> = [
            ("tumbling", self.tumbling),
            ("hopping", self.hopping),
            ("sliding", self.sliding),
            ("session", self.session),
        ]
        .iter()
        .filter(|(_, d)| d.is_some())
        .map(|(n, _)| *n)
        .collect();
        if given.len() > 1 {
            return Err(format!(
                "a window has one kind, got {}: write one of {KINDS}",
                given.join(" and ")
            ));
        }
        if self.advance.is_some() && self.hopping.is_none() {
            return Err(match given.first() {
                Some(&"tumbling") => {
                    "advance belongs to hopping windows: tumbling windows advance by their size"
                        .into()
                }
                Some(k) => format!("advance belongs to hopping windows, not {k} windows"),
                None => format!("give the window's kind: {KINDS}"),
            });
        }
        let positive = |what: &str, d: Duration| {
            if d > Duration::ZERO {
                Ok(d)
            } else {
                Err(format!("{what} must be more than 0"))
            }
        };
        match (self.tumbling, self.hopping, self.sliding, self.session) {
            (Some(size), ..) => Ok(WindowKind::Tumbling {
                size: positive("tumbling", size)?,
            }),
            (_, Some(size), ..) => {
                let size = positive("hopping", size)?;
                match self.advance {
                    None => Err("hopping windows need advance: how far apart windows start, e.g. {hopping: 1h, advance: 5m, grace: 0s}".into()),
                    Some(advance) if advance == Duration::ZERO || advance > size => Err(format!(
                        "advance must be more than 0 and at most the window size ({size}), got {advance}"
                    )),
                    Some(advance)
                        if size.as_millis().div_ceil(advance.as_millis())
                            > MAX_HOPPING_WINDOWS =>
                    {
                        Err(format!(
                            "a record falls into {} windows of {size} that start every {advance}, more than {MAX_HOPPING_WINDOWS}: each is a store update per record; make advance larger",
                            size.as_millis().div_ceil(advance.as_millis())
                        ))
                    }
                    Some(advance) => Ok(WindowKind::Hopping { size, advance }),
                }
            }
            (_, _, Some(size), _) => Ok(WindowKind::Sliding {
                size: positive("sliding", size)?,
            }),
            (.., Some(gap)) => Ok(WindowKind::Session {
                gap: positive("session", gap)?,
            }),
            _ => Err(format!("give the window's kind: {KINDS}")),
        }
    }

    /// How long windows stay in the store: `retention`, never less than what the window
    /// still needs after its start, which is also the default (as Kafka Streams' DSL: size +
    /// grace; for sliding windows twice the size + grace, as a record creates windows that
    /// far back; for sessions the gap + grace after the session's end).
    pub fn retention(&self) -> Result<Duration, String> {
        let (least, what) = match self.kind()? {
            WindowKind::Tumbling { size } | WindowKind::Hopping { size, .. } => {
                (size.saturating_add(self.grace), "size + grace")
            }
            WindowKind::Sliding { size } => (
                size.saturating_add(size).saturating_add(self.grace),
                "twice the size + grace",
            ),
            WindowKind::Session { gap } => (gap.saturating_add(self.grace), "gap + grace"),
        };
        match self.retention {
            Some(r) if r < least => Err(format!(
                "retention {r} is less than {what} ({least}): windows would be dropped while records may still update them"
            )),
            Some(r) => Ok(r),
            None => Ok(least),
        }
    }
}

/// What kind of store an aggregation step keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreKind {
    KeyValue,
    /// Windows of a key, kept for `retention` after their start.
    Window {
        retention: Duration,
    },
}

/// A store a topology declares, at the aggregation step that defines it.
#[derive(Clone, Debug, PartialEq)]
pub struct StoreDecl<'a> {
    pub step: usize,
    pub keyword: &'static str,
    /// The store's name; a `suppress` step's buffer is named after its aggregation's store.
    pub name: std::borrow::Cow<'a, str>,
    pub in_memory: bool,
    pub kind: StoreKind,
}

/// Every store of a topology in step order. A `window` makes the aggregation after it a
/// window store (a window whose sizes are wrong gives a key-value kind here; validation
/// refuses it before anything uses the layout). A stream join declares a window store per
/// side and, for left and outer joins, the store of records waiting for a partner.
pub fn stores(topology: &[Step]) -> Vec<StoreDecl<'_>> {
    let mut out = Vec::new();
    for (i, step) in topology.iter().enumerate() {
        if let Step::Join(JoinStep {
            materialize: Some(m),
            stream: None,
            ..
        }) = step
        {
            out.push(StoreDecl {
                step: i,
                keyword: "join",
                name: m.store.as_str().into(),
                in_memory: false,
                kind: StoreKind::KeyValue,
            });
            continue;
        }
        if let Step::Join(j) = step
            && j.stream.is_some()
        {
            let prefix = j.store_prefix(i);
            let window = StoreKind::Window {
                retention: j.retention(),
            };
            let outer = (j.kind != JoinType::Inner).then_some(("outer", StoreKind::KeyValue));
            for (side, kind) in [("left", window), ("right", window)]
                .into_iter()
                .chain(outer)
            {
                out.push(StoreDecl {
                    step: i,
                    keyword: "join",
                    name: format!("{prefix}-{side}").into(),
                    in_memory: false,
                    kind,
                });
            }
            continue;
        }
        let (name, in_memory) = match step {
            Step::Count(c) => (c.store.as_str().into(), c.in_memory),
            Step::Aggregate(a) => (a.store.as_str().into(), a.in_memory),
            Step::Reduce(r) => (r.store.as_str().into(), r.in_memory),
            // The buffer is always in RocksDB: it holds every open window, which only disk
            // bounds, and spills there past the record cache's share of the memory budget.
            Step::Suppress(_) => match out.last() {
                Some(StoreDecl { name, step, .. }) if *step + 1 == i => {
                    (suppress_store(name).into(), false)
                }
                _ => continue,
            },
            _ => continue,
        };
        let kind = match i.checked_sub(1).and_then(|j| topology.get(j)) {
            Some(Step::Window(w)) if !matches!(step, Step::Suppress(_)) => w
                .retention()
                .map_or(StoreKind::KeyValue, |retention| StoreKind::Window {
                    retention,
                }),
            _ => StoreKind::KeyValue,
        };
        out.push(StoreDecl {
            step: i,
            keyword: step.keyword(),
            name,
            in_memory,
            kind,
        });
    }
    out
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToStep {
    pub topic: String,
    /// Key format (default: the key's current format; after a window, `windowed`). A
    /// windowed key is written `windowed` (Kafka Streams' windowed serdes), `json`
    /// (`{"key": …, "start": ms, "end": ms}`) or `string` (`[key@start/end]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<Format>,
    /// Value format (default: the value's current format).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Format>,
}

pub(crate) fn default_key_format() -> Format {
    Format::String
}
pub(crate) fn default_value_format() -> Format {
    Format::Json
}

/// One step: exactly one of the known keys. An unknown step is an undeclared field, which
/// the API server names in its rejection (`.spec.topology[1].cont: field not declared in
/// schema`). `groupBy` is a string or an object, which a structural schema can only leave
/// open (and CEL cannot see); `manifest::validate` checks its shape and name (the worker at
/// start, the operator before it creates anything).
pub(crate) fn schema() -> Value {
    let d = |mut v: Value, text: &str| {
        v["description"] = json!(text);
        v
    };
    let string = json!({"type": "string", "minLength": 1});
    let format = json!({"type": "string", "enum": ["string", "json", "bytes", "i64"]});
    let topic =
        json!({"type": "string", "minLength": 1, "maxLength": 249, "pattern": "^[a-zA-Z0-9._-]+$"});
    let store =
        json!({"type": "string", "minLength": 1, "maxLength": 200, "pattern": "^[a-zA-Z0-9._-]+$"});
    let store = d(
        store,
        "Name of the state store: its changelog is <applicationId>-<store>-changelog.",
    );
    let in_memory = json!({"type": "boolean", "description": "Keep the store in memory instead of RocksDB (restored in full from its changelog at every start)."});
    let (store_reduce, in_memory_reduce) = (store.clone(), in_memory.clone());
    let duration = json!({"type": "string", "pattern": crate::duration::PATTERN});
    json!({
        "type": "object",
        "description": format!("One step, a one-key map: {STEPS}"),
        "maxProperties": 1,
        "minProperties": 1,
        "properties": {
            "from": {"type": "object", "description": "Read a topic (or a table of spec.tables): one task per partition.", "properties": {
                "topic": d(topic.clone(), "The source topic (it must exist)."),
                "table": d(string.clone(), "A table of spec.tables, instead of topic: its updates, for a table-table join."),
                "key": d(format.clone(), "Key format: string, json, bytes or i64 (default string); not with table (tables.<name>.key sets it)."),
                "value": d(format.clone(), "Value format: json, string, bytes or i64 (default json); not with table (tables.<name>.value sets it)."),
                "timestamp": d(string.clone(), "jq: the event time in ms since the epoch, from the value (default: the record's timestamp).")}},
            "filter": d(string.clone(), "jq: keep the records for which it is true (`.` is the value, $key the key, $ts the timestamp)."),
            "map": d(string.clone(), "jq: replace the value by each of its outputs."),
            "groupBy": {"x-kubernetes-preserve-unknown-fields": true, "description": "Re-key: a jq expression, or {key: <jq>, format: FORMAT, name: NAME}. The name names the repartition topic <applicationId>-<name>-repartition; without one, the step's index does."},
            "join": {"type": "object", "description": "Join each record with a table of spec.tables (its value for the record's key; a global table's for `key`), or with the records of another stream of the same key at most `within` apart.", "required": ["as"], "properties": {
                "table": d(string.clone(), "A table of spec.tables (or stream)."),
                "stream": {"type": "object", "description": "The other stream of a windowed stream-stream join (or table): co-partitioned with this one.", "required": ["topic"], "properties": {
                    "topic": d(topic.clone(), "The other stream's topic (it must exist, with as many partitions)."),
                    "key": d(format.clone(), "Key format (default string): the same as the joining stream's key."),
                    "value": d(format.clone(), "Value format (default json)."),
                    "timestamp": d(string.clone(), "jq: the event time in ms since the epoch, from the value (default: the record's timestamp).")}},
                "key": d(string.clone(), "Global tables only: jq giving the lookup key from the record (default the record's key)."),
                "within": d(duration.clone(), "Stream joins (required there): how far apart in event time two records may be and still join, either way."),
                "grace": d(duration.clone(), "Stream joins: how long after its window ends a left or outer join waits before emitting a record unjoined (default 0s)."),
                "store": d(json!({"type": "string", "minLength": 1, "maxLength": 190, "pattern": "^[a-zA-Z0-9._-]+$"}), "Stream joins: prefix of the stores <store>-left, <store>-right and <store>-outer (default join-<step index>)."),
                "as": d(string.clone(), "jq: the joined value, with . the record's value and $right the other side's (null when a left or outer join finds nothing)."),
                "type": d(json!({"type": "string", "enum": ["inner", "left", "outer"]}), "inner (default) drops records nothing joins; left keeps them with $right null; outer (stream and table-table joins) keeps the other side's too, with . null."),
                "materialize": {"type": "object", "description": "Table-table joins: also keep the joined table in a store.", "required": ["store"], "properties": {"store": d(json!({"type": "string", "minLength": 1, "maxLength": 200, "pattern": "^[a-zA-Z0-9._-]+$"}), "Name of the store: its changelog is <applicationId>-<store>-changelog.")}}}},
            "window": {"type": "object", "description": "Make the next count, aggregate or reduce per key and time window: {tumbling: 5m, grace: 30s}, {hopping: 1h, advance: 5m, grace: 0s}, {sliding: 10m, grace: 1m} or {session: 30m, grace: 1m}.", "required": ["grace"], "properties": {
                "tumbling": d(duration.clone(), "Size of tumbling windows."),
                "hopping": d(duration.clone(), "Size of hopping windows."),
                "advance": d(duration.clone(), "How far apart hopping windows start (more than 0, at most the size, and at least size / 10000)."),
                "sliding": d(duration.clone(), "Size of sliding windows: records at most this far apart share a window (Kafka Streams' SlidingWindows time difference)."),
                "session": d(duration.clone(), "Inactivity gap of session windows: a key's records closer than this are one session."),
                "grace": d(duration.clone(), "How late a record may arrive and still count in its window (0s drops every late record)."),
                "retention": d(duration, "How long windows are kept: at least, and by default, size + grace (twice the size + grace for sliding windows, gap + grace for sessions).")}},
            "count": {"type": "object", "description": "Count records per key into a store; emits the updated count (i64).", "required": ["store"], "properties": {"store": store.clone(), "inMemory": in_memory.clone()}},
            "aggregate": {"type": "object", "description": "Fold records per key into a store; emits the updated aggregate.", "required": ["store", "initial", "add"], "properties": {
                "store": store, "initial": d(string.clone(), "jq: the first aggregate of a key (input: the record value)."),
                "add": d(string.clone(), "jq: the new aggregate, with $agg bound to the current one."),
                "merge": d(string.clone(), "Session windows only (and required there): jq combining two sessions' aggregates, $agg and $other, when a record bridges them."),
                "inMemory": in_memory}},
            "reduce": {"type": "object", "description": "Combine the records of a key: the first value as it is, then `with`; emits the updated value.", "required": ["store", "with"], "properties": {
                "store": store_reduce, "with": d(string.clone(), "jq: the new value, with . the record's value and $agg the current one."), "inMemory": in_memory_reduce}},
            "suppress": {"type": "string", "enum": ["untilWindowCloses"], "description": "After a windowed aggregation: emit one final result per window once stream time passes its end plus grace (buffered in the store <store>-suppress, on disk)."},
            "to": {"type": "object", "description": "Write to a topic, partitioned by Kafka's murmur2 of the key bytes.", "required": ["topic"], "properties": {
                "topic": d(topic, "The output topic (it must exist)."),
                "key": d(json!({"type": "string", "enum": ["string", "json", "bytes", "i64", "windowed"]}), "Key format (default: the key's current format; after a window, windowed). A windowed key is written windowed (Kafka Streams' windowed serdes), json ({key, start, end}) or string ([key@start/end])."),
                "value": d(format, "Value format (default: the value's current format).")}},
        },
    })
}
