//! The join half of eddy vs Kafka Streams (`compare`): the input (`Generate --joins` of the
//! reference app: orders, customers, countries, shipments, accounts), each case's eddy app,
//! both engines' outputs compared, and a model of Kafka Streams' join semantics written here
//! from its rules (per-task processing order by head-record timestamp, latest table value,
//! the stream-stream join's windows, shared stream time and held-back unjoined records), run on
//! the input as read back from the broker, that Kafka Streams' output must match exactly.
//!
//! Stream outputs are compared as the sequence of records per key (value bytes, timestamp,
//! partition, in output offset order); the table-table join's as its final table.

use crate::compare::Case;
use crate::*;
use anyhow::{Context as _, Result, bail};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::process::{Command, Stdio};

/// Customers of the join input: each orders ~10 times, every ~10 minutes of event time.
pub fn join_keys(records: usize) -> usize {
    (records / 10).max(10)
}

/// Partitions of the global table's topic: not the orders' count, as a global table allows.
pub const GLOBAL_PARTITIONS: i32 = 3;

/// The stream-stream cases' join window (each side), grace and window store retention.
pub const WITHIN_MS: i64 = 5 * 60_000;
pub const GRACE_MS: i64 = 60_000;
pub const RETENTION_MS: i64 = 2 * WITHIN_MS + GRACE_MS;

/// The topics of one generated join input, all named `<prefix>-<suffix>`.
#[derive(Clone, Debug)]
pub struct JoinInput {
    pub prefix: String,
    /// What the generator printed (also the record of `<prefix>-done`).
    pub summary: Value,
}

pub const ORDERS: &str = "orders";
pub const CUSTOMERS: &str = "customers";
pub const SHIPMENTS: &str = "shipments";
pub const ACCOUNTS: &str = "accounts";
pub const COUNTRIES: &str = "countries";
const DONE: &str = "done";

impl JoinInput {
    pub fn topic(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.prefix)
    }

    /// Records of one topic, as the generator counted them.
    pub fn count(&self, suffix: &str) -> usize {
        self.summary["topics"][suffix].as_u64().unwrap_or(0) as usize
    }

    fn topics(partitions: i32) -> [(&'static str, i32); 6] {
        [
            (ORDERS, partitions),
            (CUSTOMERS, partitions),
            (SHIPMENTS, partitions),
            (ACCOUNTS, partitions),
            (COUNTRIES, GLOBAL_PARTITIONS),
            (DONE, 1),
        ]
    }
}

/// The join case's two input topics: the stream (or the left table) and the other side.
pub fn sides(case: Case) -> Result<(&'static str, &'static str)> {
    Ok(match case {
        Case::StreamTableInner | Case::StreamTableLeft => (ORDERS, CUSTOMERS),
        Case::GlobalTable => (ORDERS, COUNTRIES),
        Case::StreamStream | Case::StreamStreamInner => (ORDERS, SHIPMENTS),
        Case::TableTable => (CUSTOMERS, ACCOUNTS),
        Case::StreamTableVersioned => (SHIPMENTS, CUSTOMERS),
        _ => bail!("{} is not a join case", case.name()),
    })
}

/// Records a case's tasks process: both sides, but a global table's (restored, not processed).
pub fn processed(case: Case, input: &JoinInput) -> Result<usize> {
    let (left, right) = sides(case)?;
    Ok(input.count(left)
        + if case == Case::GlobalTable {
            0
        } else {
            input.count(right)
        })
}

/// eddy's app for a join case: `.` is the left (stream) value, `$right` the other side's (null
/// on a miss of a left join); the `as` objects are what the reference app's joiners build.
pub fn eddy_yaml(
    case: Case,
    g: crate::compare::Guarantee,
    app: &str,
    input: &JoinInput,
    output: &str,
) -> Result<String> {
    let (o, c, s, a, g_) = (
        input.topic(ORDERS),
        input.topic(CUSTOMERS),
        input.topic(SHIPMENTS),
        input.topic(ACCOUNTS),
        input.topic(COUNTRIES),
    );
    let from = format!("  - from: {{topic: {o}, key: string, value: json}}\n");
    let body = match case {
        Case::StreamTableInner => format!(
            "tables:\n  customers: {{topic: {c}, key: string, value: json}}\ntopology:\n{from}  - join: {{table: customers, as: '{{order: .order, amount: .amount, name: $right.name}}'}}\n"
        ),
        Case::StreamTableLeft => format!(
            "tables:\n  customers: {{topic: {c}, key: string, value: json}}\ntopology:\n{from}  - join: {{table: customers, type: left, as: '{{order: .order, amount: .amount, name: $right.name}}'}}\n"
        ),
        Case::GlobalTable => format!(
            "tables:\n  countries: {{topic: {g_}, global: true}}\ntopology:\n{from}  - join: {{table: countries, key: '.country', as: '{{order: .order, country: $right.name}}'}}\n"
        ),
        Case::StreamStream => format!(
            "topology:\n{from}  - join: {{stream: {{topic: {s}, key: string, value: json}}, within: 5m, grace: 1m, type: left, as: '{{order: .order, shipment: $right.shipment}}'}}\n"
        ),
        Case::StreamStreamInner => format!(
            "topology:\n{from}  - join: {{stream: {{topic: {s}, key: string, value: json}}, within: 5m, grace: 1m, as: '{{order: .order, shipment: $right.shipment}}'}}\n"
        ),
        Case::TableTable => format!(
            "tables:\n  customers: {{topic: {c}}}\n  accounts: {{topic: {a}}}\ntopology:\n  - from: {{table: customers}}\n  - join: {{table: accounts, type: left, as: '{{name: .name, balance: $right.balance}}'}}\n"
        ),
        Case::StreamTableVersioned => format!(
            "tables:\n  customers: {{topic: {c}, versioned: {{history: 10m}}}}\ntopology:\n  - from: {{topic: {s}, key: string, value: json}}\n  - join: {{table: customers, type: left, as: '{{shipment: .shipment, name: $right.name, tier: $right.tier}}'}}\n"
        ),
        _ => bail!("{} is not a join case", case.name()),
    };
    Ok(format!(
        "applicationId: {app}\nprocessingGuarantee: {}\n{body}  - to: {{topic: {output}}}\n",
        g.eddy()
    ))
}

/// The input's summary if `<prefix>-done` holds it and every topic has the records it lists.
fn complete(prefix: &str, partitions: i32) -> Result<Option<Value>> {
    let done = format!("{prefix}-{DONE}");
    if partition_count(&done)? != 1 || read_count_fast(&done)? != 1 {
        return Ok(None);
    }
    let records = read_all(&done)?;
    let Some(v) = records.last().and_then(|r| r.value.as_deref()) else {
        return Ok(None);
    };
    let summary: Value = serde_json::from_slice(v).context("parsing the join input's summary")?;
    for (suffix, parts) in JoinInput::topics(partitions) {
        let topic = format!("{prefix}-{suffix}");
        if suffix == DONE {
            continue;
        }
        if partition_count(&topic)? != parts
            || read_count_fast(&topic)? != summary["topics"][suffix].as_i64().unwrap_or(-1)
        {
            return Ok(None);
        }
    }
    Ok(Some(summary))
}

/// The join input (`Generate --joins`, seed 1, `records` orders over [`join_keys`] customers),
/// reused when a complete one of the same sizes exists.
pub fn ensure_join_input(
    jar: &Path,
    records: usize,
    partitions: i32,
    prefix: &str,
) -> Result<JoinInput> {
    let keys = join_keys(records);
    let prefix = format!("{prefix}-joins-{records}-{keys}-{partitions}");
    if let Some(summary) = complete(&prefix, partitions)? {
        eprintln!("reusing join input {prefix}-*");
        return Ok(JoinInput { prefix, summary });
    }
    let topics: Vec<String> = JoinInput::topics(partitions)
        .iter()
        .map(|(s, _)| format!("{prefix}-{s}"))
        .collect();
    let refs: Vec<&str> = topics.iter().map(String::as_str).collect();
    let _ = delete_topics(&refs);
    wait_until(std::time::Duration::from_secs(30), || {
        for t in &topics {
            if partition_count(t)? != 0 {
                return Ok(false);
            }
        }
        Ok(true)
    })?;
    eprintln!("producing the join input {prefix}-*: {records} orders over {keys} customers");
    let out = Command::new("java")
        .arg("-cp")
        .arg(jar)
        .arg("dev.eddy.bench.Generate")
        .args(["--joins", "--bootstrap", &bootstrap()?, "--topic", &prefix])
        .args(["--records", &records.to_string()])
        .args(["--keys", &keys.to_string()])
        .args(["--partitions", &partitions.to_string()])
        .args(["--global-partitions", &GLOBAL_PARTITIONS.to_string()])
        .args(["--seed", "1"])
        .stderr(Stdio::inherit())
        .output()
        .context("running the reference app's Generate --joins")?;
    if !out.status.success() {
        bail!("Generate --joins failed ({})", out.status);
    }
    let line = String::from_utf8_lossy(&out.stdout);
    eprintln!("{}", line.trim());
    let summary = serde_json::from_str(line.trim()).context("parsing Generate --joins' line")?;
    Ok(JoinInput { prefix, summary })
}

/// One input record: partition, offset, key, value (None: a tombstone), timestamp.
#[derive(Clone, Debug)]
pub struct Rec {
    pub partition: i32,
    pub offset: i64,
    pub key: String,
    pub value: Option<Value>,
    pub ts: i64,
}

/// Every topic of the input, read back in partition and offset order.
pub struct Input {
    pub partitions: i32,
    pub topics: HashMap<&'static str, Vec<Rec>>,
}

impl Input {
    fn of(&self, suffix: &str) -> &[Rec] {
        self.topics.get(suffix).map_or(&[], Vec::as_slice)
    }

    /// One partition (task) of a topic, in offset order.
    fn partition(&self, suffix: &str, p: i32) -> Vec<&Rec> {
        self.of(suffix)
            .iter()
            .filter(|r| r.partition == p)
            .collect()
    }
}

pub fn read_input(input: &JoinInput) -> Result<Input> {
    let mut topics = HashMap::new();
    let mut partitions = 0;
    for suffix in [ORDERS, CUSTOMERS, SHIPMENTS, ACCOUNTS, COUNTRIES] {
        let topic = input.topic(suffix);
        if suffix == ORDERS {
            partitions = partition_count(&topic)?;
        }
        let recs = read_all(&topic)?
            .into_iter()
            .map(|r| {
                let key =
                    String::from_utf8(r.key.clone().unwrap_or_default()).with_context(|| {
                        format!("{topic}: key at {}@{} is not UTF-8", r.partition, r.offset)
                    })?;
                let value = match &r.value {
                    None => None,
                    Some(v) => Some(serde_json::from_slice(v).with_context(|| {
                        format!("{topic}: value at {}@{} is not JSON", r.partition, r.offset)
                    })?),
                };
                Ok(Rec {
                    partition: r.partition,
                    offset: r.offset,
                    key,
                    value,
                    ts: r.timestamp,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        topics.insert(suffix, recs);
    }
    Ok(Input { partitions, topics })
}

/// An output record: key, partition, value (None: a tombstone), timestamp.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Out {
    pub key: String,
    pub partition: i32,
    pub value: Option<Vec<u8>>,
    pub ts: i64,
}

pub fn read_output(topic: &str) -> Result<Vec<Out>> {
    read_all(topic)?
        .into_iter()
        .map(|r| {
            Ok(Out {
                key: String::from_utf8(r.key.unwrap_or_default())
                    .with_context(|| format!("{topic}: a key is not UTF-8"))?,
                partition: r.partition,
                value: r.value,
                ts: r.timestamp,
            })
        })
        .collect()
}

// ------------------------------------------------------------------------------ the model

static NULL: Value = Value::Null;

/// jq's `.name`: the field, or null when the value is null, not an object, or lacks it.
fn field<'a>(v: Option<&'a Value>, name: &str) -> &'a Value {
    v.and_then(|v| v.get(name)).unwrap_or(&NULL)
}

/// A jq object literal as eddy (and the reference app, through Jackson) writes it: compact,
/// fields in the literal's order.
fn object(fields: &[(&str, &Value)]) -> Vec<u8> {
    let mut s = String::from("{");
    for (i, (k, v)) in fields.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&Value::from(*k).to_string());
        s.push(':');
        s.push_str(&v.to_string());
    }
    s.push('}');
    s.into_bytes()
}

/// The `as` of each case on (left, right) values.
fn joined(case: Case, left: Option<&Value>, right: Option<&Value>) -> Vec<u8> {
    match case {
        Case::StreamTableInner | Case::StreamTableLeft => object(&[
            ("order", field(left, "order")),
            ("amount", field(left, "amount")),
            ("name", field(right, "name")),
        ]),
        Case::GlobalTable => object(&[
            ("order", field(left, "order")),
            ("country", field(right, "name")),
        ]),
        Case::StreamStream | Case::StreamStreamInner => object(&[
            ("order", field(left, "order")),
            ("shipment", field(right, "shipment")),
        ]),
        Case::StreamTableVersioned => object(&[
            ("shipment", field(left, "shipment")),
            ("name", field(right, "name")),
            ("tier", field(right, "tier")),
        ]),
        _ => object(&[
            ("name", field(left, "name")),
            ("balance", field(right, "balance")),
        ]),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Left,
    Right,
}

/// One task's processing order over two co-partitioned topics, as Kafka Streams' partition
/// group picks it when all input is on the broker before the task starts: the partition whose
/// head record has the smaller timestamp goes next (within a partition, offset order, whatever
/// the timestamps); with `max.task.idle.ms` 0 it waits for a partition known to have more data.
/// Equal head timestamps would make the order arbitrary: the generator never writes them, and
/// they fail the model.
fn merge<'a>(left: &[&'a Rec], right: &[&'a Rec]) -> Result<Vec<(Side, &'a Rec)>> {
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::with_capacity(left.len() + right.len());
    while i < left.len() || j < right.len() {
        let side = match (left.get(i), right.get(j)) {
            (Some(l), Some(r)) if l.ts == r.ts => bail!(
                "the input has records of equal timestamps {} at the heads of partition {} of both sides (offsets {} and {}): Kafka Streams' processing order would be arbitrary",
                l.ts,
                l.partition,
                l.offset,
                r.offset
            ),
            (Some(l), Some(r)) if l.ts < r.ts => Side::Left,
            (Some(_), None) => Side::Left,
            _ => Side::Right,
        };
        match side {
            Side::Left => {
                out.push((side, left[i]));
                i += 1;
            }
            Side::Right => {
                out.push((side, right[j]));
                j += 1;
            }
        }
    }
    Ok(out)
}

/// What the model expects a case to write, and how much of it joined.
#[derive(Clone, Debug, Default)]
pub struct Model {
    /// Stream cases: every output record, per task in processing order.
    pub records: Vec<Out>,
    /// The table-table case: the final table.
    pub table: BTreeMap<String, (i32, Vec<u8>)>,
    /// Results with both sides.
    pub joined: usize,
    /// Results of a left join with a null right side.
    pub unjoined: usize,
    /// Stream records that produced nothing.
    pub dropped: usize,
}

impl Model {
    pub fn run(case: Case, input: &Input) -> Result<Model> {
        match case {
            Case::StreamTableInner | Case::StreamTableLeft => stream_table(case, input),
            Case::GlobalTable => global_table(input),
            Case::StreamStream | Case::StreamStreamInner => stream_stream(case, input),
            Case::TableTable => Ok(table_table(input)),
            Case::StreamTableVersioned => stream_table_versioned(input),
            _ => bail!("{} is not a join case", case.name()),
        }
    }

    fn emit(&mut self, key: &str, partition: i32, value: Vec<u8>, ts: i64, matched: bool) {
        if matched {
            self.joined += 1;
        } else {
            self.unjoined += 1;
        }
        self.records.push(Out {
            key: key.to_string(),
            partition,
            value: Some(value),
            ts,
        });
    }
}

/// `KStreamKTableJoin` with a non-versioned table: a stream record joins the table's value for
/// its key at the time it is processed (the latest update processed before it in the task);
/// inner drops a miss, left joins it with null. The result has the stream record's key and
/// timestamp. Table updates produce nothing; a tombstone deletes the key.
fn stream_table(case: Case, input: &Input) -> Result<Model> {
    let mut m = Model::default();
    for p in 0..input.partitions {
        let mut table: HashMap<&str, &Value> = HashMap::new();
        let (orders, customers) = (input.partition(ORDERS, p), input.partition(CUSTOMERS, p));
        for (side, r) in merge(&orders, &customers)? {
            match (side, &r.value) {
                (Side::Right, Some(v)) => {
                    table.insert(&r.key, v);
                }
                (Side::Right, None) => {
                    table.remove(r.key.as_str());
                }
                // Kafka Streams skips a stream record with a null value; the input has none.
                (Side::Left, None) => m.dropped += 1,
                (Side::Left, Some(v)) => match table.get(r.key.as_str()) {
                    Some(c) => m.emit(&r.key, p, joined(case, Some(v), Some(c)), r.ts, true),
                    None if case == Case::StreamTableLeft => {
                        m.emit(&r.key, p, joined(case, Some(v), None), r.ts, false)
                    }
                    None => m.dropped += 1,
                },
            }
        }
    }
    Ok(m)
}

/// The versioned case's history: a lookup this far behind the table's stream time (its
/// latest update's) sees only a value set before it and not changed since.
pub const HISTORY_MS: i64 = 10 * 60_000;

/// `KStreamKTableJoinProcessor` with a versioned table (`RocksDBVersionedStore`), left: a
/// shipment joins its customer as of the shipment's time. The table keeps each key's versions
/// (a tombstone is a version without value); an update older than `HISTORY_MS` behind the
/// table's stream time (the largest time put) is dropped, one within it goes into history
/// (replacing a version of the same time). A lookup at `t` sees the latest version at or
/// before `t` (none, or a tombstone: null); when `t` is more than `HISTORY_MS` behind stream
/// time only the key's newest version answers, if it is a value from at or before `t`.
fn stream_table_versioned(input: &Input) -> Result<Model> {
    let case = Case::StreamTableVersioned;
    let mut m = Model::default();
    for p in 0..input.partitions {
        let mut table: HashMap<&str, BTreeMap<i64, Option<&Value>>> = HashMap::new();
        let mut stream_time = -1i64;
        let (shipments, customers) = (input.partition(SHIPMENTS, p), input.partition(CUSTOMERS, p));
        for (side, r) in merge(&shipments, &customers)? {
            match (side, &r.value) {
                (Side::Right, v) => {
                    if r.ts < stream_time - HISTORY_MS {
                        continue;
                    }
                    stream_time = stream_time.max(r.ts);
                    table.entry(&r.key).or_default().insert(r.ts, v.as_ref());
                }
                (Side::Left, None) => m.dropped += 1,
                (Side::Left, Some(v)) => {
                    let versions = table.get(r.key.as_str());
                    let found = versions.and_then(|vs| {
                        if r.ts < stream_time - HISTORY_MS {
                            vs.last_key_value()
                                .filter(|(t, _)| **t <= r.ts)
                                .and_then(|(_, v)| *v)
                        } else {
                            vs.range(..=r.ts).next_back().and_then(|(_, v)| *v)
                        }
                    });
                    m.emit(
                        &r.key,
                        p,
                        joined(case, Some(v), found),
                        r.ts,
                        found.is_some(),
                    );
                }
            }
        }
    }
    Ok(m)
}

/// `KStreamGlobalKTableJoin` (inner): the global table is restored whole before any order is
/// processed; an order joins the country its `.country` names; a null or unknown country drops
/// it. Key and timestamp are the order's.
fn global_table(input: &Input) -> Result<Model> {
    let mut countries: HashMap<&str, &Value> = HashMap::new();
    for r in input.of(COUNTRIES) {
        match &r.value {
            Some(v) => countries.insert(&r.key, v),
            None => countries.remove(r.key.as_str()),
        };
    }
    let mut m = Model::default();
    for r in input.of(ORDERS) {
        let country = field(r.value.as_ref(), "country").as_str();
        match country.and_then(|c| countries.get(c)) {
            Some(c) => m.emit(
                &r.key,
                r.partition,
                joined(Case::GlobalTable, r.value.as_ref(), Some(c)),
                r.ts,
                true,
            ),
            None => m.dropped += 1,
        }
    }
    Ok(m)
}

/// A record in a join window store: timestamp, insertion sequence, value.
struct Stored<'a> {
    ts: i64,
    seq: u64,
    value: &'a Value,
}

/// The left join's unjoined left records: (timestamp, key bytes) -> (key, value) in the order
/// they were put, ordered as Kafka Streams' outer store orders them.
type Held<'a> = BTreeMap<(i64, Vec<u8>), Vec<(&'a str, &'a Value)>>;

/// `KStreamKStreamJoin` (Kafka Streams 4.4, `JoinWindows.ofTimeDifferenceAndGrace(5 min,
/// 1 min)`, unjoined records emitted on every record: the reference app sets the internal
/// emit interval to 0). Per task, both sides share one stream time (the largest timestamp
/// either side has processed). A record first looks up the other side's window store for its
/// key and timestamps within 5 min (the store only shows what is younger than its own largest
/// timestamp − retention + 1, retention = 11 min), in timestamp then insertion order, and emits
/// one result per match at the larger of both timestamps; then it is put into its own side's
/// store. No record is dropped as late: grace only decides when an unjoined left record of a
/// left join is emitted. Such a record is emitted at once, with null, if its window already
/// ended (timestamp + 5 min < stream time); otherwise it waits in the "outer" store (ordered by
/// timestamp, then key bytes) until a record at stream time finds it closed (timestamp + 5 min +
/// 1 min < stream time), and is forgotten if a right record joins it first. The scan of that
/// store is skipped while its recorded minimum time + 6 min ≥ stream time, and that minimum is
/// the timestamp of the LAST entry the previous scan visited (not the smallest left): this
/// decides when unjoined records come out relative to other results of the same key.
fn stream_stream(case: Case, input: &Input) -> Result<Model> {
    let outer = case == Case::StreamStream;
    let mut m = Model::default();
    for p in 0..input.partitions {
        let (orders, shipments) = (input.partition(ORDERS, p), input.partition(SHIPMENTS, p));
        let mut stream_time = -1i64;
        let mut min_time = i64::MAX;
        let mut stores: [HashMap<&str, Vec<Stored>>; 2] = [HashMap::new(), HashMap::new()];
        let mut observed = [-1i64; 2];
        let mut seq = 0u64;
        let mut held: Held = BTreeMap::new();
        for (side, r) in merge(&orders, &shipments)? {
            let ts = r.ts;
            stream_time = stream_time.max(ts);
            let Some(value) = r.value.as_ref() else {
                // Skipped (null value); the input has none.
                m.dropped += 1;
                continue;
            };
            if outer && ts == stream_time {
                // Java's long arithmetic: MAX_VALUE + 6 min wraps and never skips the scan.
                if min_time.wrapping_add(WITHIN_MS + GRACE_MS) < stream_time {
                    min_time = i64::MAX;
                    let mut closed = Vec::new();
                    for (k, _) in held.iter() {
                        min_time = k.0;
                        if k.0 + WITHIN_MS + GRACE_MS < stream_time {
                            closed.push(k.clone());
                        }
                    }
                    for k in closed {
                        for (key, left) in held.remove(&k).unwrap_or_default() {
                            m.emit(key, p, joined(case, Some(left), None), k.0, false);
                        }
                    }
                }
            }
            let (this, other) = match side {
                Side::Left => (0, 1),
                Side::Right => (1, 0),
            };
            let from = (ts - WITHIN_MS)
                .max(0)
                .max(observed[other] - RETENTION_MS + 1);
            let to = (ts + WITHIN_MS).max(0);
            let mut matches: Vec<&Stored> = stores[other]
                .get(r.key.as_str())
                .map(|v| v.iter().filter(|s| s.ts >= from && s.ts <= to).collect())
                .unwrap_or_default();
            matches.sort_by_key(|s| (s.ts, s.seq));
            for s in &matches {
                if side == Side::Right {
                    held.remove(&(s.ts, r.key.as_bytes().to_vec()));
                }
                let (l, rv) = match side {
                    Side::Left => (value, s.value),
                    Side::Right => (s.value, value),
                };
                m.emit(
                    &r.key,
                    p,
                    joined(case, Some(l), Some(rv)),
                    ts.max(s.ts),
                    true,
                );
            }
            if side == Side::Left && matches.is_empty() {
                if !outer {
                    m.dropped += 1;
                } else if to < stream_time {
                    m.emit(&r.key, p, joined(case, Some(value), None), ts, false);
                } else {
                    min_time = min_time.min(ts);
                    held.entry((ts, r.key.as_bytes().to_vec()))
                        .or_default()
                        .push((&r.key, value));
                }
            }
            stores[this]
                .entry(&r.key)
                .or_default()
                .push(Stored { ts, seq, value });
            seq += 1;
            observed[this] = observed[this].max(ts);
        }
        // Still held at the end of the input: not emitted (no record moved stream time past
        // their window).
    }
    Ok(m)
}

/// `KTableKTableLeftJoin`, final state: once every update is processed (and the record caches
/// flushed), the last result per customer is the latest customer joined with the latest
/// account (null if it has none); a deleted customer's last result is a tombstone.
fn table_table(input: &Input) -> Model {
    let last = |suffix| {
        let mut t: HashMap<&str, (i32, &Value)> = HashMap::new();
        for r in input.of(suffix) {
            match &r.value {
                Some(v) => t.insert(&r.key, (r.partition, v)),
                None => t.remove(r.key.as_str()),
            };
        }
        t
    };
    let (customers, accounts) = (last(CUSTOMERS), last(ACCOUNTS));
    let mut m = Model::default();
    for (key, (p, c)) in &customers {
        let a = accounts.get(key).map(|(_, a)| *a);
        if a.is_some() {
            m.joined += 1;
        } else {
            m.unjoined += 1;
        }
        m.table
            .insert(key.to_string(), (*p, joined(Case::TableTable, Some(c), a)));
    }
    m
}

// ------------------------------------------------------------------------------ comparing

/// What a join comparison found.
#[derive(Clone, Debug, Default)]
pub struct Checked {
    /// Output records (table-table: keys of the final table).
    pub outputs: usize,
    pub keys: usize,
    pub joined: usize,
    pub unjoined: usize,
    /// Stream records that produced nothing (inner misses).
    pub dropped: usize,
    /// Table-table: keys on which Kafka Streams' final table differs from the model's.
    pub kstreams_deviations: usize,
    /// One line for the log.
    pub summary: String,
}

type Seq = BTreeMap<String, Vec<(i32, Option<Vec<u8>>, i64)>>;

fn by_key(records: &[Out]) -> Seq {
    let mut m: Seq = BTreeMap::new();
    for r in records {
        m.entry(r.key.clone())
            .or_default()
            .push((r.partition, r.value.clone(), r.ts));
    }
    m
}

fn show(x: Option<&(i32, Option<Vec<u8>>, i64)>) -> String {
    x.map_or("nothing".into(), |(p, v, ts)| {
        format!(
            "{} at {ts} in partition {p}",
            v.as_deref()
                .map_or("tombstone".into(), |v| String::from_utf8_lossy(v)
                    .to_string())
        )
    })
}

/// Err with the first keys whose sequences of records differ.
fn diff_sequences(case: Case, a_name: &str, a: &Seq, b_name: &str, b: &Seq) -> Result<()> {
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    let empty = Vec::new();
    let diffs: Vec<String> = keys
        .iter()
        .filter_map(|k| {
            let (x, y) = (a.get(*k).unwrap_or(&empty), b.get(*k).unwrap_or(&empty));
            let i = (0..x.len().max(y.len())).find(|&i| x.get(i) != y.get(i))?;
            Some(format!(
                "  {k} (records {} / {}): #{i}: {a_name} {} / {b_name} {}",
                x.len(),
                y.len(),
                show(x.get(i)),
                show(y.get(i))
            ))
        })
        .collect();
    if !diffs.is_empty() {
        bail!(
            "{}: {} of {} keys have other records from {a_name} ({}) than from {b_name} ({}); first ones:\n{}",
            case.name(),
            diffs.len(),
            keys.len(),
            a.values().map(Vec::len).sum::<usize>(),
            b.values().map(Vec::len).sum::<usize>(),
            diffs[..diffs.len().min(10)].join("\n")
        );
    }
    Ok(())
}

type Table = BTreeMap<String, (i32, Vec<u8>)>;

/// The last record per key; a tombstone removes the key.
fn final_table(records: &[Out]) -> Table {
    let mut t = BTreeMap::new();
    for r in records {
        match &r.value {
            Some(v) => t.insert(r.key.clone(), (r.partition, v.clone())),
            None => t.remove(&r.key),
        };
    }
    t
}

/// The keys on which two final tables differ, one line each.
fn table_diffs(a_name: &str, a: &Table, b_name: &str, b: &Table) -> Vec<String> {
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    let f = |x: Option<&(i32, Vec<u8>)>| {
        x.map_or("missing".to_string(), |(p, v)| {
            format!("{} in partition {p}", String::from_utf8_lossy(v))
        })
    };
    keys.iter()
        .filter(|k| a.get(**k) != b.get(**k))
        .map(|k| {
            format!(
                "  {k}: {a_name} {} / {b_name} {}",
                f(a.get(*k)),
                f(b.get(*k))
            )
        })
        .collect()
}

fn diff_tables(case: Case, a_name: &str, a: &Table, b_name: &str, b: &Table) -> Result<()> {
    let diffs = table_diffs(a_name, a, b_name, b);
    if !diffs.is_empty() {
        bail!(
            "{}: {} keys of the final table differ ({a_name} {} keys, {b_name} {}); first ones:\n{}",
            case.name(),
            diffs.len(),
            a.len(),
            b.len(),
            diffs[..diffs.len().min(10)].join("\n")
        );
    }
    Ok(())
}

/// Compare eddy's output (when it ran) with Kafka Streams', then Kafka Streams' with the model.
/// Stream cases: the same records per key, in the same order (value bytes, timestamp,
/// partition); table-table: eddy's final table is the model's (value bytes, partition), and
/// where Kafka Streams' differs from it the keys are counted, not failed: at a million records
/// its table-table output changes from run to run (see docs/benchmarks.md).
pub fn compare(case: Case, input: &Input, eddy_out: Option<&str>, ks_out: &str) -> Result<Checked> {
    let k = read_output(ks_out)?;
    let e = eddy_out.map(read_output).transpose()?;
    let model = Model::run(case, input)?;
    let mut c = Checked {
        joined: model.joined,
        unjoined: model.unjoined,
        dropped: model.dropped,
        ..Checked::default()
    };
    if case == Case::TableTable {
        let kt = final_table(&k);
        let et = e.as_deref().map(final_table);
        if let Some(et) = &et {
            diff_tables(case, "eddy", et, "the model", &model.table)?;
        }
        let ks_diffs = table_diffs("Kafka Streams", &kt, "the model", &model.table);
        c.kstreams_deviations = ks_diffs.len();
        let table = et.as_ref().unwrap_or(&kt);
        (c.outputs, c.keys) = (table.len(), table.len());
        let counts = format!(
            "{} customers ({} with an account, {} without)",
            model.table.len(),
            model.joined,
            model.unjoined
        );
        let ks_note = (!ks_diffs.is_empty()).then(|| {
            format!(
                "Kafka Streams' ({} keys from {} records) differs from it on {} keys, first ones:\n{}",
                kt.len(),
                k.len(),
                ks_diffs.len(),
                ks_diffs[..ks_diffs.len().min(5)].join("\n")
            )
        });
        c.summary = match (et.is_some(), ks_note) {
            (true, None) => {
                format!("eddy's and Kafka Streams' final tables are the model's: {counts}")
            }
            (false, None) => format!("Kafka Streams' final table is the model's: {counts}"),
            (true, Some(n)) => format!("eddy's final table is the model's: {counts}; {n}"),
            (false, Some(n)) => format!("the model's final table: {counts}; {n}"),
        };
    } else {
        let ks = by_key(&k);
        if let Some(e) = &e {
            diff_sequences(case, "eddy", &by_key(e), "Kafka Streams", &ks)?;
        }
        diff_sequences(
            case,
            "Kafka Streams",
            &ks,
            "the model",
            &by_key(&model.records),
        )?;
        (c.outputs, c.keys) = (k.len(), ks.len());
        c.summary = format!(
            "{} records over {} keys agree{} record by record and match the model: {} joined, {} with a null right side, {} input records without a result",
            k.len(),
            ks.len(),
            if e.is_some() {
                ""
            } else {
                " (Kafka Streams only)"
            },
            model.joined,
            model.unjoined,
            model.dropped
        );
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rec(p: i32, offset: i64, key: &str, value: Option<Value>, ts: i64) -> Rec {
        Rec {
            partition: p,
            offset,
            key: key.into(),
            value,
            ts,
        }
    }

    fn input(topics: Vec<(&'static str, Vec<Rec>)>) -> Input {
        Input {
            partitions: 1,
            topics: topics.into_iter().collect(),
        }
    }

    fn values(m: &Model) -> Vec<String> {
        m.records
            .iter()
            .map(|r| {
                format!(
                    "{}@{}",
                    String::from_utf8_lossy(r.value.as_deref().unwrap_or(b"")),
                    r.ts
                )
            })
            .collect()
    }

    #[test]
    fn objects_are_compact_in_literal_order() {
        let v = json!({"order": 7, "amount": -3});
        let c = json!({"name": "Zoë \"Z\""});
        assert_eq!(
            joined(Case::StreamTableLeft, Some(&v), Some(&c)),
            r#"{"order":7,"amount":-3,"name":"Zoë \"Z\""}"#.as_bytes()
        );
        assert_eq!(
            joined(Case::StreamTableLeft, Some(&v), None),
            r#"{"order":7,"amount":-3,"name":null}"#.as_bytes()
        );
    }

    /// An order sees the table as of its timestamp among the task's records, not the final one.
    #[test]
    fn stream_table_sees_updates_in_timestamp_order() -> Result<()> {
        let i = input(vec![
            (
                ORDERS,
                vec![
                    rec(0, 0, "c1", Some(json!({"order": 0})), 10),
                    rec(0, 1, "c1", Some(json!({"order": 1})), 30),
                    rec(0, 2, "c1", Some(json!({"order": 2})), 50),
                ],
            ),
            (
                CUSTOMERS,
                vec![
                    rec(0, 0, "c1", Some(json!({"name": "a"})), 21),
                    rec(0, 1, "c1", None, 41),
                ],
            ),
        ]);
        let left = stream_table(Case::StreamTableLeft, &i)?;
        assert_eq!(
            values(&left),
            [
                r#"{"order":0,"amount":null,"name":null}@10"#,
                r#"{"order":1,"amount":null,"name":"a"}@30"#,
                r#"{"order":2,"amount":null,"name":null}@50"#
            ]
        );
        let inner = stream_table(Case::StreamTableInner, &i)?;
        assert_eq!((inner.records.len(), inner.dropped), (1, 2));
        Ok(())
    }

    /// A versioned table answers as of the shipment's time: a late shipment meets the older
    /// version, an out-of-order update lands in the history, one older than the history is
    /// dropped, and a lookup beyond the history sees only a newest version older than it.
    #[test]
    fn versioned_lookups_are_as_of_the_record_within_the_history() -> Result<()> {
        let m = 60_000;
        let ship = |o, n, ts| rec(0, o, "c1", Some(json!({"shipment": n})), ts);
        let cust = |o, n: &str, ts| rec(0, o, "c1", Some(json!({"name": n})), ts);
        let i = input(vec![
            (
                SHIPMENTS,
                vec![
                    ship(0, 0, 30 * m),
                    // Late: 25 and 5 min before the stream time of 30 min.
                    ship(1, 1, 5 * m + 1),
                    ship(2, 2, 25 * m),
                    ship(3, 3, 5 * m - 2),
                    ship(4, 4, 20 * m),
                ],
            ),
            (
                CUSTOMERS,
                vec![
                    cust(0, "a", 1),
                    cust(1, "b", 10 * m),
                    cust(2, "c", 29 * m),
                    // Out of order: 24 to 29 min; 11 min behind is beyond the history.
                    cust(3, "d", 24 * m),
                    cust(4, "x", 18 * m),
                ],
            ),
        ]);
        let got = stream_table_versioned(&i)?;
        let names: Vec<String> = got
            .records
            .iter()
            .map(|r| {
                let v: Value = serde_json::from_slice(r.value.as_deref().unwrap_or(b"null"))
                    .unwrap_or(Value::Null);
                v["name"].as_str().unwrap_or("null").to_string()
            })
            .collect();
        // 30 min: c. 5 min + 1 ms: beyond the history (stream time 29 min), and the newest
        // version (c) is later: null. 25 min: d (in history). 5 min - 2 ms: null likewise.
        // 20 min: b, x having been dropped.
        assert_eq!(names, ["c", "null", "d", "null", "b"]);
        Ok(())
    }

    /// A shipment after its order joins it when it comes; an order nothing joins comes out
    /// with null once a record at stream time finds its window (+ grace) closed.
    #[test]
    fn stream_stream_left_holds_unjoined_orders_until_the_window_closes() -> Result<()> {
        let min = 60_000;
        let i = input(vec![
            (
                ORDERS,
                vec![
                    rec(0, 0, "c1", Some(json!({"order": 0})), 0),
                    rec(0, 1, "c2", Some(json!({"order": 1})), min),
                    rec(0, 2, "c3", Some(json!({"order": 2})), 20 * min),
                ],
            ),
            (
                SHIPMENTS,
                vec![rec(0, 0, "c2", Some(json!({"shipment": 9})), 2 * min + 1)],
            ),
        ]);
        let m = stream_stream(Case::StreamStream, &i)?;
        assert_eq!(
            values(&m),
            [
                format!(r#"{{"order":1,"shipment":9}}@{}"#, 2 * min + 1),
                r#"{"order":0,"shipment":null}@0"#.to_string(),
            ]
        );
        // Order 2 is still held at the end of the input.
        assert_eq!((m.joined, m.unjoined), (1, 1));
        Ok(())
    }

    /// Equal timestamps at the heads of both sides: Kafka Streams' order would be arbitrary.
    #[test]
    fn equal_head_timestamps_fail() {
        let a = rec(0, 0, "c1", None, 5);
        let b = rec(0, 0, "c1", None, 5);
        assert!(merge(&[&a], &[&b]).is_err());
    }
}
