//! Reading an application file: a whole `StatefulStreamApp` manifest or its bare `spec`,
//! checked so that every mistake is reported with the field it concerns and what is expected.

use crate::security::{self, Source};
use crate::spec::AppSpec;
use crate::step::{JoinStep, Step};
use crate::{API_VERSION, KIND, topics};
use serde::Deserialize;
use std::collections::{HashMap, HashSet};

/// A parsed and validated application.
#[derive(Clone, Debug, PartialEq)]
pub struct AppManifest {
    /// `metadata.name`, when the file is a whole manifest.
    pub name: Option<String>,
    pub spec: AppSpec,
    /// Where the spec's fields are in the file, for error messages: `spec.` in a whole
    /// manifest, nothing in a bare spec.
    pub spec_path: &'static str,
}

impl AppManifest {
    /// `spec.applicationId`, else `metadata.name` (a standalone worker knows no namespace).
    pub fn application_id(&self) -> Option<&str> {
        self.spec.application_id.as_deref().or(self.name.as_deref())
    }
}

/// The application id of an app: `explicit` (`spec.applicationId`) when set; otherwise, for a
/// resource in a namespace (under the operator), `<namespace>.<name>`, which no other app can
/// default to because a namespace name cannot contain '.'; without a namespace (a standalone
/// file), the name. Every name derived from it (internal topics, consumer group,
/// transactional ids, state dirs) is therefore unique per resource.
pub fn application_id(namespace: Option<&str>, name: &str, explicit: Option<&str>) -> String {
    match (explicit, namespace) {
        (Some(id), _) => id.to_string(),
        (None, Some(ns)) if !ns.is_empty() => format!("{ns}.{name}"),
        (None, _) => name.to_string(),
    }
}

/// Read a spec from the JSON the API server holds, as strictly as [`parse_app`] reads a file:
/// a value the CRD schema lets through but the types refuse (`groupBy: 42`, a field of the
/// wrong type stored before a schema change) comes back with its field path, e.g.
/// `spec.topology[1]: ...`. The caller validates.
pub fn spec_from_json(spec: &serde_json::Value) -> Result<AppSpec, ManifestError> {
    #[derive(Deserialize)]
    struct Doc {
        spec: AppSpec,
    }
    // Through YAML text, as `parse_app` does, for serde_yaml's field paths; positions in
    // that generated text mean nothing to the user, so they are cut off.
    let text = serde_yaml::to_string(&serde_json::json!({ "spec": spec }))
        .map_err(|e| ManifestError::Yaml(e.to_string()))?;
    serde_yaml::from_str::<Doc>(&text)
        .map(|d| d.spec)
        .map_err(|e| {
            let mut message = e.to_string();
            if let Some(l) = e.location() {
                let at = format!(" at line {} column {}", l.line(), l.column());
                if let Some(cut) = message.rfind(&at) {
                    message.replace_range(cut..cut + at.len(), "");
                }
            }
            ManifestError::Yaml(message)
        })
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{0}")]
    Yaml(String),
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> ManifestError {
    ManifestError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Whole {
    #[serde(default)]
    metadata: Metadata,
    spec: Option<AppSpec>,
    // `apiVersion` and `kind` are checked before; `status` of a manifest read back from the
    // cluster is ignored.
}

#[derive(Default, Deserialize)]
struct Metadata {
    name: Option<String>,
}

/// Parse and validate an application file (YAML or JSON).
pub fn parse_app(text: &str) -> Result<AppManifest, ManifestError> {
    let doc: serde_yaml::Value = serde_yaml::from_str(text)
        .map_err(|e| ManifestError::Yaml(format!("not valid YAML: {e}")))?;
    let field = |k: &str| {
        doc.get(k)
            .map(|v| v.as_str().unwrap_or_default().to_string())
    };
    let (api_version, kind) = (field("apiVersion"), field("kind"));
    // Typed parsing from the text (not from `doc`) keeps serde_yaml's field paths and
    // positions in error messages, e.g. `spec.topology[1]: unknown variant ...`.
    let yaml = |e: serde_yaml::Error| ManifestError::Yaml(e.to_string());
    if api_version.is_none() && kind.is_none() {
        let spec: AppSpec = serde_yaml::from_str(text).map_err(yaml)?;
        validate(&spec, "")?;
        return Ok(AppManifest {
            name: None,
            spec,
            spec_path: "",
        });
    }
    if api_version.as_deref() != Some(API_VERSION) {
        return Err(invalid(
            "apiVersion",
            format!(
                "expected {API_VERSION:?}, got {:?}",
                api_version.unwrap_or_default()
            ),
        ));
    }
    if kind.as_deref() != Some(KIND) {
        return Err(invalid(
            "kind",
            format!("expected {KIND:?}, got {:?}", kind.unwrap_or_default()),
        ));
    }
    let whole: Whole = serde_yaml::from_str(text).map_err(yaml)?;
    let spec = whole.spec.ok_or_else(|| {
        invalid(
            "spec",
            "missing: a StatefulStreamApp needs a spec with a topology",
        )
    })?;
    validate(&spec, "spec.")?;
    Ok(AppManifest {
        name: whole.metadata.name,
        spec,
        spec_path: "spec.",
    })
}

/// `expressionTimeoutMs` when the spec does not set it.
pub const DEFAULT_EXPRESSION_TIMEOUT_MS: u64 = 1000;
/// `livenessTimeoutMs` when the spec does not set it.
pub const DEFAULT_LIVENESS_TIMEOUT_MS: u64 = 300_000;
/// Shortest `livenessTimeoutMs` accepted: shorter would restart workers during ordinary pauses.
pub const MIN_LIVENESS_TIMEOUT_MS: u64 = 10_000;

/// Most worker pods an app may ask for. The operator keeps per-pod state, so an absurd count
/// (say 2147483647) would exhaust its memory; a task per pod beyond this is not a real need.
pub const MAX_REPLICAS: i32 = 1000;

/// Checks a structural schema cannot express: step order, unique stores, legal names.
pub fn validate(spec: &AppSpec, prefix: &str) -> Result<(), ManifestError> {
    let f = |s: String| format!("{prefix}{s}");
    let expression = spec
        .expression_timeout_ms
        .unwrap_or(DEFAULT_EXPRESSION_TIMEOUT_MS);
    if expression == 0 {
        return Err(invalid(
            f("expressionTimeoutMs".into()),
            "must be at least 1",
        ));
    }
    let liveness = spec
        .liveness_timeout_ms
        .unwrap_or(DEFAULT_LIVENESS_TIMEOUT_MS);
    if liveness < MIN_LIVENESS_TIMEOUT_MS || liveness <= expression {
        return Err(invalid(
            f("livenessTimeoutMs".into()),
            format!(
                "must be at least {MIN_LIVENESS_TIMEOUT_MS} and more than expressionTimeoutMs \
                 ({expression}), got {liveness}: a worker is restarted when its processing \
                 thread makes no progress for that long"
            ),
        ));
    }
    if let Some(id) = &spec.application_id {
        topics::check_name(id).map_err(|m| invalid(f("applicationId".into()), m))?;
    }
    if let Some(r) = spec.replicas
        && !(0..=MAX_REPLICAS).contains(&r)
    {
        return Err(invalid(
            f("replicas".into()),
            format!("must be 0 to {MAX_REPLICAS} (worker pods), got {r}"),
        ));
    }
    // More standbys than other pods is not an error: as many as fit are placed (the status
    // says so), so scaling down below numStandbyReplicas + 1 is not refused.
    if let Some(s) = spec.num_standby_replicas
        && s < 0
    {
        return Err(invalid(
            f("numStandbyReplicas".into()),
            format!("must be 0 or more, got {s}"),
        ));
    }
    if let Some(w) = &spec.warmup {
        if let Some(m) = w.max_warmup_replicas
            && m < 1
        {
            return Err(invalid(
                f("warmup.maxWarmupReplicas".into()),
                format!("must be at least 1, got {m}: a task that moves needs a warm-up to move"),
            ));
        }
        if let Some(l) = w.acceptable_recovery_lag
            && l < 0
        {
            return Err(invalid(
                f("warmup.acceptableRecoveryLag".into()),
                format!("must be 0 or more (changelog records), got {l}"),
            ));
        }
    }
    spec.memory_bytes()
        .map_err(|(field, message)| invalid(f(field.into()), message))?;
    check_transactions(spec, prefix)?;
    check_kafka(spec, prefix)?;
    if spec.topology.is_empty() {
        return Err(invalid(
            f("topology".into()),
            "is empty: the first step must be `from: {topic: ...}`",
        ));
    }
    let mut stores = HashSet::new();
    check_tables(spec, prefix, &mut stores)?;
    // Sub-topology and step of the first join of each table that is not global.
    let mut joined: HashMap<&str, (usize, usize)> = HashMap::new();
    // The other streams of stream joins, and the step joining each.
    let mut streams: HashMap<&str, usize> = HashMap::new();
    let mut subtopology = 0;
    // The key's format where each step sees it.
    let mut key_format = crate::Format::String;
    // Repartition topic id (step name or index) -> the groupBy that writes it.
    let mut repartitions: HashMap<String, (usize, Option<&str>)> = HashMap::new();
    // True once a windowed aggregation made the key a windowed one.
    let mut windowed = false;
    // The table the topology reads (`from: {table}`), if it reads one.
    let mut source_table: Option<&str> = None;
    for (i, step) in spec.topology.iter().enumerate() {
        let field = f(format!("topology[{i}]"));
        let after_window = i > 0 && matches!(spec.topology[i - 1], Step::Window(_));
        match step {
            Step::From(from) => {
                if i != 0 {
                    return Err(invalid(field, "`from` may only be the first step"));
                }
                if let Some(name) = &from.table {
                    key_format = check_table_source(spec, &field, from, name)?;
                    source_table = Some(name.as_str());
                    continue;
                }
                if from.topic.is_empty() {
                    return Err(invalid(
                        format!("{field}.from"),
                        "give the topic to read (from: {topic: <topic>}) or a table of tables (from: {table: <name>})",
                    ));
                }
                topics::check_name(&from.topic)
                    .map_err(|m| invalid(format!("{field}.from.topic"), m))?;
                key_format = from.key_format();
                if let Some((name, _)) = spec
                    .tables
                    .iter()
                    .find(|(_, t)| t.topic == from.topic && !t.global)
                {
                    return Err(invalid(
                        format!("{field}.from.topic"),
                        format!(
                            "{:?} is also the topic of table {name:?}: a task reads a topic partition once; read it as a stream or as a table",
                            from.topic
                        ),
                    ));
                }
                for (what, format) in [("key", from.key_format()), ("value", from.value_format())] {
                    not_windowed(format, &format!("{field}.from.{what}"))?;
                }
                if from.timestamp.as_ref().is_some_and(|e| e.trim().is_empty()) {
                    return Err(invalid(
                        format!("{field}.from.timestamp"),
                        "the jq expression is empty: remove it to use the records' timestamps",
                    ));
                }
            }
            _ if i == 0 => {
                return Err(invalid(
                    field,
                    "the first step must be `from: {topic: ...}`",
                ));
            }
            _ if source_table.is_some() && !matches!(step, Step::To(_) | Step::Join(_)) => {
                return Err(invalid(
                    format!("{field}.{}", step.keyword()),
                    format!(
                        "after a table source (from: {{table: ...}}) a topology joins tables and writes the result (join: {{table: ...}}, to): {} on a table is not supported yet",
                        step.keyword()
                    ),
                ));
            }
            Step::To(to) => {
                if i + 1 != spec.topology.len() {
                    return Err(invalid(field, "`to` must be the last step"));
                }
                topics::check_name(&to.topic)
                    .map_err(|m| invalid(format!("{field}.to.topic"), m))?;
                not_windowed(
                    to.value.unwrap_or(crate::Format::Json),
                    &format!("{field}.to.value"),
                )?;
                match (windowed, to.key) {
                    (true, Some(crate::Format::Bytes | crate::Format::I64)) => {
                        return Err(invalid(
                            format!("{field}.to.key"),
                            "the key is windowed here: write it as windowed (Kafka Streams' windowed serdes), json ({key, start, end}) or string ([key@start/end])",
                        ));
                    }
                    (false, Some(k)) => not_windowed(k, &format!("{field}.to.key"))?,
                    _ => {}
                }
            }
            Step::Window(w) => {
                w.kind()
                    .and_then(|_| w.retention())
                    .map_err(|m| invalid(format!("{field}.window"), m))?;
                if !matches!(
                    spec.topology.get(i + 1),
                    Some(Step::Count(_) | Step::Aggregate(_) | Step::Reduce(_))
                ) {
                    return Err(invalid(
                        format!("{field}.window"),
                        "a window must be followed by count, aggregate or reduce, which it makes per window",
                    ));
                }
            }
            Step::Count(c) => {
                check_store(&mut stores, &c.store, &format!("{field}.count.store"))?;
                windowed = after_window;
            }
            Step::Aggregate(a) => {
                check_store(&mut stores, &a.store, &format!("{field}.aggregate.store"))?;
                let session = i > 0
                    && matches!(&spec.topology[i - 1], Step::Window(w) if w.session.is_some());
                match (session, &a.merge) {
                    (true, None) => {
                        return Err(invalid(
                            format!("{field}.aggregate"),
                            "after a session window, aggregate needs merge: a jq expression combining two sessions' aggregates ($agg and $other) when a record bridges them, e.g. merge: '$agg + $other'",
                        ));
                    }
                    (true, Some(m)) if m.trim().is_empty() => {
                        return Err(invalid(
                            format!("{field}.aggregate.merge"),
                            "the jq expression is empty",
                        ));
                    }
                    (false, Some(_)) => {
                        return Err(invalid(
                            format!("{field}.aggregate.merge"),
                            "merge is for session windows only (put `window: {session: ..., grace: ...}` before this step, or remove merge)",
                        ));
                    }
                    _ => {}
                }
                windowed = after_window;
            }
            Step::Suppress(_) => {
                let aggregation = i >= 2
                    && matches!(spec.topology[i - 2], Step::Window(_))
                    && matches!(
                        spec.topology[i - 1],
                        Step::Count(_) | Step::Aggregate(_) | Step::Reduce(_)
                    );
                if !aggregation {
                    return Err(invalid(
                        format!("{field}.suppress"),
                        "suppress comes right after a windowed count, aggregate or reduce (window, then the aggregation, then suppress)",
                    ));
                }
                if let Some(d) = crate::step::stores(&spec.topology)
                    .into_iter()
                    .find(|d| d.step == i)
                {
                    check_store(&mut stores, &d.name, &format!("{field}.suppress"))?;
                }
            }
            Step::Reduce(r) => {
                check_store(&mut stores, &r.store, &format!("{field}.reduce.store"))?;
                if r.with.trim().is_empty() {
                    return Err(invalid(
                        format!("{field}.reduce.with"),
                        "the jq expression is empty",
                    ));
                }
                windowed = after_window;
            }
            Step::Filter(e) | Step::Map(e) => {
                if e.trim().is_empty() {
                    return Err(invalid(field, "the jq expression is empty"));
                }
            }
            Step::Join(j) => {
                if windowed {
                    return Err(invalid(
                        format!("{field}.join"),
                        "the key is windowed here (after a windowed aggregation): a join matches plain keys",
                    ));
                }
                if j.as_.trim().is_empty() {
                    return Err(invalid(
                        format!("{field}.join.as"),
                        "the jq expression is empty",
                    ));
                }
                let table_name = match (&j.table, &j.stream) {
                    (Some(t), None) => t,
                    (None, Some(_)) if source_table.is_some() => {
                        return Err(invalid(
                            format!("{field}.join.stream"),
                            "a table joins tables: to join a stream with a table, read the stream (from: {topic: ...}) and join the table",
                        ));
                    }
                    (None, Some(stream)) => {
                        check_stream_join(
                            spec,
                            i,
                            j,
                            stream,
                            key_format,
                            &mut streams,
                            &mut stores,
                        )?;
                        continue;
                    }
                    (t, _) => {
                        return Err(invalid(
                            format!("{field}.join"),
                            format!(
                                "a join has {} a table (join: {{table: <name>, as: ...}}) or a stream (join: {{stream: {{topic: <topic>}}, within: 5m, as: ...}})",
                                if t.is_some() { "either" } else { "one of" }
                            ),
                        ));
                    }
                };
                if let Some(left) = source_table {
                    check_table_join(spec, &field, j, left, table_name, &mut stores)?;
                } else if j.materialize.is_some() {
                    return Err(invalid(
                        format!("{field}.join.materialize"),
                        "materialize keeps a table-table join's result: a stream-table join's result is a stream (write it with to, or aggregate it)",
                    ));
                }
                for (what, given) in [
                    ("within", j.within.is_some()),
                    ("grace", j.grace.is_some()),
                    ("store", j.store.is_some()),
                ] {
                    if given {
                        return Err(invalid(
                            format!("{field}.join.{what}"),
                            format!(
                                "{what} is for stream joins: a table join has the table's store and no window (remove it)"
                            ),
                        ));
                    }
                }
                if j.kind == crate::JoinType::Outer && source_table.is_none() {
                    return Err(invalid(
                        format!("{field}.join.type"),
                        "a stream-table join is inner or left: an outer join needs a stream or a table on both sides",
                    ));
                }
                let Some(table) = spec.tables.get(table_name) else {
                    let defined: Vec<&str> = spec.tables.keys().map(String::as_str).collect();
                    return Err(invalid(
                        format!("{field}.join.table"),
                        match defined.is_empty() {
                            true => format!(
                                "no table {table_name:?}: declare it in {prefix}tables, e.g. tables: {{{table_name}: {{topic: <topic>}}}}"
                            ),
                            false => format!(
                                "no table {table_name:?} in {prefix}tables (it has {})",
                                defined.join(", ")
                            ),
                        },
                    ));
                };
                match (&j.key, table.global) {
                    (Some(_), false) => {
                        return Err(invalid(
                            format!("{field}.join.key"),
                            format!(
                                "key picks the lookup key of a global table; table {:?} is partitioned like the stream and looked up by the record's key (re-key with groupBy before the join, or make the table global: true)",
                                table_name
                            ),
                        ));
                    }
                    (Some(k), true) if k.trim().is_empty() => {
                        return Err(invalid(
                            format!("{field}.join.key"),
                            "the jq expression is empty: remove it to look up the record's key",
                        ));
                    }
                    (_, false) => {
                        if table.key != key_format {
                            return Err(invalid(
                                format!("{field}.join"),
                                format!(
                                    "the key is {} here but table {:?}'s key is {}: a join looks up the key's bytes in the partition they hash to, so both need the same format (set tables.{}.key, or the format of from.key or groupBy)",
                                    format_name(key_format),
                                    table_name,
                                    format_name(table.key),
                                    table_name
                                ),
                            ));
                        }
                        if let Some((sub, j0)) =
                            joined.insert(table_name.as_str(), (subtopology, i))
                            && sub != subtopology
                        {
                            return Err(invalid(
                                format!("{field}.join.table"),
                                format!(
                                    "table {:?} is joined on both sides of a groupBy (topology[{j0}] and here): its store belongs to the tasks of one sub-topology; join it on one side only, or make it global: true",
                                    table_name
                                ),
                            ));
                        }
                    }
                    _ => {}
                }
            }
            Step::GroupBy(g) => {
                subtopology += 1;
                key_format = g.format();
                if g.expr().trim().is_empty() {
                    return Err(invalid(field, "the jq expression is empty"));
                }
                if let Some(name) = g.name() {
                    topics::check_name(name)
                        .map_err(|m| invalid(format!("{field}.groupBy.name"), m))?;
                }
                not_windowed(g.format(), &format!("{field}.groupBy.format"))?;
                windowed = false;
                let id = topics::repartition_id(i, g.name());
                if let Some((j, other)) = repartitions.insert(id.clone(), (i, g.name())) {
                    return Err(same_repartition(prefix, (j, other), (i, g.name()), &id));
                }
            }
        }
    }
    check_tables_used(spec, prefix)
}

/// `from: {table}`: a partitioned table of `spec.tables`, read with its own formats and the
/// record timestamps. Gives the key's format.
fn check_table_source(
    spec: &AppSpec,
    field: &str,
    from: &crate::step::FromStep,
    name: &str,
) -> Result<crate::Format, ManifestError> {
    if !from.topic.is_empty() {
        return Err(invalid(
            format!("{field}.from"),
            "read a topic or a table, not both: remove topic (the table names its topic)",
        ));
    }
    if from.timestamp.is_some() {
        return Err(invalid(
            format!("{field}.from.timestamp"),
            "a table's updates keep their records' timestamps: remove timestamp",
        ));
    }
    let Some(table) = spec.tables.get(name) else {
        return Err(invalid(
            format!("{field}.from.table"),
            format!(
                "no table {name:?}: declare it in tables, e.g. tables: {{{name}: {{topic: <topic>}}}}"
            ),
        ));
    };
    // The default is let through: apps and ConfigMaps written before this was checked
    // carry `key: string, value: json` whatever the table's formats.
    for (what, given, own, default) in [
        (
            "key",
            from.key,
            table.key,
            crate::step::default_key_format(),
        ),
        (
            "value",
            from.value,
            table.value,
            crate::step::default_value_format(),
        ),
    ] {
        if let Some(g) = given
            && g != own
            && g != default
        {
            return Err(invalid(
                format!("{field}.from.{what}"),
                format!(
                    "a table's formats are its own (tables.{name}.{what} is {}): set tables.{name}.{what} and remove this",
                    format_name(own)
                ),
            ));
        }
    }
    if table.global {
        return Err(invalid(
            format!("{field}.from.table"),
            format!(
                "table {name:?} is global: a topology reads a partitioned table (remove global: true), as Kafka Streams joins a GlobalKTable only from a stream"
            ),
        ));
    }
    not_versioned(name, table, &format!("{field}.from.table"))?;
    Ok(table.key)
}

/// Versioned tables answer stream-table joins as of the stream record's time; a table-table
/// join would have to skip their out-of-order updates (Kafka Streams does), which it does not.
fn not_versioned(name: &str, table: &crate::TableSpec, field: &str) -> Result<(), ManifestError> {
    if table.versioned.is_some() {
        return Err(invalid(
            field.to_string(),
            format!(
                "table {name:?} is versioned: so far a versioned table is only joined from a stream (from: {{table}} and table-table joins are not supported on one yet); remove versioned (the table then keeps each key's latest value)"
            ),
        ));
    }
    Ok(())
}

/// A table-table join: another partitioned table, a `materialize` store, one such join.
fn check_table_join(
    spec: &AppSpec,
    field: &str,
    j: &JoinStep,
    left: &str,
    right: &str,
    stores: &mut HashSet<String>,
) -> Result<(), ManifestError> {
    if right == left {
        return Err(invalid(
            format!("{field}.join.table"),
            format!("table {left:?} is the source: a table-table join joins two tables"),
        ));
    }
    if spec.tables.get(right).is_some_and(|t| t.global) {
        return Err(invalid(
            format!("{field}.join.table"),
            format!(
                "table {right:?} is global: a table-table join needs a table partitioned like {left:?} (remove global: true)"
            ),
        ));
    }
    if let Some(t) = spec.tables.get(right) {
        not_versioned(right, t, &format!("{field}.join.table"))?;
    }
    let joins = spec
        .topology
        .iter()
        .filter(|s| matches!(s, Step::Join(_)))
        .count();
    if joins > 1 {
        return Err(invalid(
            format!("{field}.join"),
            "one table-table join per topology for now: join the tables two at a time in separate apps",
        ));
    }
    if let Some(m) = &j.materialize {
        check_store(stores, &m.store, &format!("{field}.join.materialize.store"))?;
    }
    Ok(())
}

/// A stream-stream join: its window, the other stream (read by the same tasks, so a topic no
/// other input of the app reads, with the key format of the joining stream), its stores.
fn check_stream_join<'a>(
    spec: &'a AppSpec,
    step: usize,
    j: &JoinStep,
    stream: &'a crate::step::JoinStream,
    key_format: crate::Format,
    streams: &mut HashMap<&'a str, usize>,
    stores: &mut HashSet<String>,
) -> Result<(), ManifestError> {
    let field = format!("topology[{step}].join");
    if j.key.is_some() {
        return Err(invalid(
            format!("{field}.key"),
            "key picks the lookup key of a global table; a stream join matches records by their keys (re-key with groupBy before the join)",
        ));
    }
    if j.materialize.is_some() {
        return Err(invalid(
            format!("{field}.materialize"),
            "materialize keeps a table-table join's result: a stream join's result is a stream (write it with to, or aggregate it)",
        ));
    }
    if j.within.is_none() {
        return Err(invalid(
            format!("{field}.within"),
            "a stream join needs within: how far apart in event time two records may be and still join, e.g. within: 5m",
        ));
    }
    topics::check_name(&stream.topic).map_err(|m| invalid(format!("{field}.stream.topic"), m))?;
    for (what, format) in [("key", stream.key), ("value", stream.value)] {
        not_windowed(format, &format!("{field}.stream.{what}"))?;
    }
    if stream
        .timestamp
        .as_ref()
        .is_some_and(|e| e.trim().is_empty())
    {
        return Err(invalid(
            format!("{field}.stream.timestamp"),
            "the jq expression is empty: remove it to use the records' timestamps",
        ));
    }
    let read_twice = |other: String| {
        invalid(
            format!("{field}.stream.topic"),
            format!(
                "{:?} is also {other}: a task reads a topic partition once, so a stream joins another topic (to join a stream with itself, copy it to a second topic first)",
                stream.topic
            ),
        )
    };
    if let Some(Step::From(from)) = spec.topology.first()
        && from.topic == stream.topic
    {
        return Err(read_twice("the topic of from".into()));
    }
    if let Some((name, _)) = spec.tables.iter().find(|(_, t)| t.topic == stream.topic) {
        return Err(read_twice(format!("the topic of table {name:?}")));
    }
    if let Some(other) = streams.insert(&stream.topic, step) {
        return Err(read_twice(format!("joined at topology[{other}]")));
    }
    if stream.key != key_format {
        return Err(invalid(
            format!("{field}.stream.key"),
            format!(
                "the key is {} here but the stream's key is {}: a join matches the keys' bytes in the partition they hash to, so both need the same format",
                format_name(key_format),
                format_name(stream.key)
            ),
        ));
    }
    for d in crate::step::stores(&spec.topology)
        .iter()
        .filter(|d| d.step == step)
    {
        check_store(stores, &d.name, &format!("{field}.store"))?;
    }
    Ok(())
}

/// A format as users write it.
fn format_name(f: crate::Format) -> String {
    serde_json::to_value(f)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{f:?}"))
}

/// `spec.tables`: legal names and formats, store names unique with the steps' stores, one
/// table per topic.
fn check_tables(
    spec: &AppSpec,
    prefix: &str,
    stores: &mut HashSet<String>,
) -> Result<(), ManifestError> {
    for (name, t) in &spec.tables {
        let field = format!("{prefix}tables.{name}");
        topics::check_name(name).map_err(|m| invalid(&field, format!("the table's name {m}")))?;
        topics::check_name(&t.topic).map_err(|m| invalid(format!("{field}.topic"), m))?;
        for (what, format) in [("key", t.key), ("value", t.value)] {
            not_windowed(format, &format!("{field}.{what}"))?;
        }
        check_store(stores, t.store_name(name), &format!("{field}.store"))?;
        if let Some((other, _)) = spec
            .tables
            .iter()
            .find(|(n, o)| *n < name && o.topic == t.topic && !o.global && !t.global)
        {
            return Err(invalid(
                format!("{field}.topic"),
                format!(
                    "table {other:?} reads {:?} too: a task reads a topic partition once, so one table per topic (or make one global: true)",
                    t.topic
                ),
            ));
        }
        if t.global && t.versioned.is_some() {
            return Err(invalid(
                format!("{field}.versioned"),
                "a global table keeps only each key's latest value (Kafka Streams refuses versioned global tables too): remove versioned, or remove global: true and join it by the stream's key",
            ));
        }
    }
    Ok(())
}

/// Every table of `spec.tables` is joined somewhere: one nothing reads is a mistake.
fn check_tables_used(spec: &AppSpec, prefix: &str) -> Result<(), ManifestError> {
    for name in spec.tables.keys() {
        if !spec.topology.iter().any(|s| match s {
            Step::Join(j) => j.table.as_ref() == Some(name),
            Step::From(f) => f.table.as_ref() == Some(name),
            _ => false,
        }) {
            return Err(invalid(
                format!("{prefix}tables.{name}"),
                "no step uses this table: join it (join: {table: ..., as: ...}) or remove it",
            ));
        }
    }
    Ok(())
}

/// `windowed` describes a windowed key on its way out; no other place reads or writes one.
fn not_windowed(format: crate::Format, field: &str) -> Result<(), ManifestError> {
    if format == crate::Format::Windowed {
        return Err(invalid(
            field.to_string(),
            "windowed is the format of a windowed key, for to.key after a window: use string, json, bytes or i64",
        ));
    }
    Ok(())
}

/// Under exactly-once a transaction stays open for a commit interval (and the commit itself):
/// a transaction timeout that is not comfortably longer makes the brokers abort transactions.
fn check_transactions(spec: &AppSpec, prefix: &str) -> Result<(), ManifestError> {
    use crate::spec::{MAX_TRANSACTION_TIMEOUT_MS, ProcessingGuarantee};
    if spec.kafka.properties.contains_key("transaction.timeout.ms") {
        return Err(invalid(
            format!("{prefix}kafka.properties.transaction.timeout.ms"),
            "set spec.transactionTimeoutMs instead: eddy checks it against commitIntervalMs",
        ));
    }
    let timeout = spec.transaction_timeout_ms();
    if !(1000..=MAX_TRANSACTION_TIMEOUT_MS).contains(&timeout) {
        return Err(invalid(
            format!("{prefix}transactionTimeoutMs"),
            format!(
                "{timeout} is out of range: give 1000 to {MAX_TRANSACTION_TIMEOUT_MS} (the brokers' default transaction.max.timeout.ms)"
            ),
        ));
    }
    let interval = spec.commit_interval_ms();
    if spec.processing_guarantee == ProcessingGuarantee::ExactlyOnce
        && interval.saturating_mul(2) > timeout
    {
        return Err(invalid(
            format!("{prefix}commitIntervalMs"),
            format!(
                "{interval} ms is more than half of transactionTimeoutMs ({timeout} ms): under exactly_once the brokers would abort transactions; lower commitIntervalMs or raise transactionTimeoutMs to at least {}",
                interval.saturating_mul(2)
            ),
        ));
    }
    Ok(())
}

/// Credentials come from Secrets only, so none lands in the app's ConfigMap or status.
fn check_kafka(spec: &AppSpec, prefix: &str) -> Result<(), ManifestError> {
    for key in spec.kafka.properties.keys() {
        if security::BROKER_PROPERTIES.contains(&key.as_str()) {
            return Err(invalid(
                format!("{prefix}kafka.properties[{key:?}]"),
                "says where the brokers are, which is kafka.bootstrapServers' job (a Secret's eddy.dev/kafka-brokers annotation is checked against it): use kafka.bootstrapServers",
            ));
        }
        if let Some((_, instead)) = security::CREDENTIAL_PROPERTIES
            .iter()
            .find(|(p, _)| p == key)
        {
            return Err(invalid(
                format!("{prefix}kafka.properties[{key:?}]"),
                format!(
                    "holds a credential, which would be stored in the app's ConfigMap: {instead}"
                ),
            ));
        }
    }
    for (c, source) in security::client_security(&spec.kafka).credentials {
        let field = format!("{prefix}{}", c.field());
        match source {
            Source::Value(v) if v.trim().is_empty() => {
                return Err(invalid(field, "is empty"));
            }
            Source::Secret(r) if r.name.trim().is_empty() || r.key.trim().is_empty() => {
                return Err(invalid(
                    field,
                    "needs both the Secret's name and the key: {secretKeyRef: {name, key}}",
                ));
            }
            _ => {}
        }
    }
    if security::password_in_clear(&spec.kafka)
        && !spec
            .kafka
            .sasl
            .as_ref()
            .is_some_and(|s| s.send_password_in_clear)
    {
        return Err(invalid(
            format!("{prefix}kafka.sasl.mechanism"),
            "PLAIN without TLS sends the password to the brokers in clear, for anyone on the network path to read: add kafka.tls, use SCRAM-SHA-512, or set kafka.sasl.sendPasswordInClear: true",
        ));
    }
    Ok(())
}

/// Two `groupBy` steps (`a` before `b`, each with its index and name) that would write the
/// same repartition topic; the error points at a step whose name can change.
fn same_repartition(
    prefix: &str,
    a: (usize, Option<&str>),
    b: (usize, Option<&str>),
    id: &str,
) -> ManifestError {
    let topic = format!("<applicationId>-{id}-repartition");
    let field = |i: usize| format!("{prefix}topology[{i}].groupBy.name");
    match (a, b) {
        ((j, Some(_)), (i, Some(_))) => invalid(
            field(i),
            format!(
                "{id:?} is already the name of topology[{j}]'s groupBy: step names must be unique within the app (each names its repartition topic {topic})"
            ),
        ),
        // One of the two is unnamed, so it writes the topic named after its index by default.
        ((j, None), (i, _)) | ((i, _), (j, None)) => invalid(
            field(i),
            format!(
                "{id:?} names the repartition topic {topic}, which topology[{j}]'s groupBy writes by default (it has no name): pick another name, or name topology[{j}] too"
            ),
        ),
    }
}

fn check_store(seen: &mut HashSet<String>, store: &str, field: &str) -> Result<(), ManifestError> {
    topics::check_name(store).map_err(|m| invalid(field, m))?;
    if !seen.insert(store.to_string()) {
        return Err(invalid(
            field,
            format!("store {store:?} is defined twice: store names must be unique"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::ProcessingGuarantee;
    use crate::step::Format;

    const DESIGN_EXAMPLE: &str = r#"
apiVersion: eddy.dev/v1alpha1
kind: StatefulStreamApp
metadata: {name: page-views}
spec:
  replicas: 3
  kafka: {bootstrapServers: "kafka:9092"}
  processingGuarantee: exactly_once
  numStandbyReplicas: 1
  warmup: {maxWarmupReplicas: 2, acceptableRecoveryLag: 10000}
  storage: {size: 10Gi}
  topology:
    - from: {topic: page-views, key: string, value: json}
    - filter: '.status == 200'
    - groupBy: '.user'
    - count: {store: views-per-user}
    - to: {topic: views-per-user, value: i64}
"#;

    #[test]
    fn reads_the_design_example() {
        let app = parse_app(DESIGN_EXAMPLE).expect("valid");
        assert_eq!(app.application_id(), Some("page-views"));
        assert_eq!(
            app.spec.processing_guarantee,
            ProcessingGuarantee::ExactlyOnce
        );
        assert_eq!(app.spec.topology.len(), 5);
        match &app.spec.topology[4] {
            Step::To(to) => assert_eq!(to.value, Some(Format::I64)),
            other => panic!("expected to, got {other:?}"),
        }
    }

    #[test]
    fn reads_a_bare_spec() {
        let app = parse_app(
            "applicationId: spend\ntopology:\n  - from: {topic: payments}\n  - aggregate: {store: spend, initial: '0', add: '$agg + .amount'}\n  - to: {topic: spend-per-user, value: json}\n",
        )
        .expect("valid");
        assert_eq!(app.application_id(), Some("spend"));
        assert_eq!(app.name, None);
    }

    fn err(text: &str) -> String {
        parse_app(text).expect_err("must be rejected").to_string()
    }

    #[test]
    fn windows_are_checked_where_they_are_written() {
        let app =
            |steps: &str| format!("topology:\n- from: {{topic: a, timestamp: '.at'}}\n{steps}");
        let ok = parse_app(&app("- window: {tumbling: 5m, grace: 30s}\n- count: {store: c}\n- to: {topic: o, key: json}\n"))
            .expect("valid");
        let decls = crate::step::stores(&ok.spec.topology);
        assert_eq!(
            decls[0].kind,
            crate::StoreKind::Window {
                retention: crate::Duration::from_millis(330_000)
            },
            "by default as long as records may change a window: size + grace"
        );
        let topics = crate::topics::layout("x", &ok.spec);
        assert_eq!(
            topics[0].stores[0].changelog_config(),
            [
                ("cleanup.policy", "compact,delete".to_string()),
                ("retention.ms", "86730000".to_string())
            ]
        );
        for (steps, field, says) in [
            (
                "- window: {tumbling: 5m}\n- count: {store: c}\n",
                "topology[1]",
                "missing field `grace`",
            ),
            (
                "- window: {tumbling: 5x, grace: 0s}\n- count: {store: c}\n",
                "topology[1]",
                "e.g. 500ms, 30s",
            ),
            (
                "- window: {hopping: 5m, grace: 0s}\n- count: {store: c}\n",
                "topology[1].window",
                "need advance",
            ),
            (
                "- window: {hopping: 5m, advance: 6m, grace: 0s}\n- count: {store: c}\n",
                "topology[1].window",
                "at most the window size",
            ),
            (
                "- window: {hopping: 1d, advance: 1s, grace: 0s}\n- count: {store: c}\n",
                "topology[1].window",
                "a record falls into 86400 windows of 1d that start every 1s, more than 10000",
            ),
            (
                "- window: {tumbling: 5m, grace: 1m, retention: 5m}\n- count: {store: c}\n",
                "topology[1].window",
                "less than size + grace",
            ),
            (
                "- window: {tumbling: 5m, grace: 0s}\n- to: {topic: o}\n",
                "topology[1].window",
                "must be followed by count",
            ),
            (
                "- window: {tumbling: 5m, grace: 0s}\n",
                "topology[1].window",
                "must be followed by count",
            ),
            (
                "- window: {tumbling: 5m, grace: 0s}\n- count: {store: c}\n- to: {topic: o, key: i64}\n",
                "topology[3].to.key",
                "the key is windowed here",
            ),
            (
                "- count: {store: c}\n- to: {topic: o, key: windowed}\n",
                "topology[2].to.key",
                "for to.key after a window",
            ),
            (
                "- reduce: {store: c, with: ' '}\n",
                "topology[1].reduce.with",
                "empty",
            ),
            (
                "- window: {tumbling: 5m, sliding: 5m, grace: 0s}\n- count: {store: c}\n",
                "topology[1].window",
                "one kind, got tumbling and sliding",
            ),
            (
                "- window: {sliding: 5m, advance: 1m, grace: 0s}\n- count: {store: c}\n",
                "topology[1].window",
                "not sliding windows",
            ),
            (
                "- window: {sliding: 5m, grace: 1m, retention: 6m}\n- count: {store: c}\n",
                "topology[1].window",
                "twice the size + grace (11m)",
            ),
            (
                "- window: {session: 0s, grace: 1m}\n- count: {store: c}\n",
                "topology[1].window",
                "session must be more than 0",
            ),
            (
                "- window: {session: 5m, grace: 0s}\n- aggregate: {store: c, initial: '0', add: '$agg + 1'}\n",
                "topology[2].aggregate",
                "needs merge",
            ),
            (
                "- window: {tumbling: 5m, grace: 0s}\n- aggregate: {store: c, initial: '0', add: '$agg + 1', merge: '$agg + $other'}\n",
                "topology[2].aggregate.merge",
                "session windows only",
            ),
            (
                "- count: {store: c}\n- suppress: untilWindowCloses\n",
                "topology[2].suppress",
                "right after a windowed count",
            ),
            (
                "- window: {tumbling: 5m, grace: 0s}\n- count: {store: c}\n- suppress: untilWindowCloses\n- groupBy: '.a'\n- count: {store: c-suppress}\n",
                "topology[5].count.store",
                "defined twice",
            ),
        ] {
            let e = err(&app(steps));
            assert!(e.contains(field) && e.contains(says), "{steps}: {e}");
        }
    }

    #[test]
    fn tables_and_joins_are_checked_where_they_are_written() {
        let ok = "tables:\n  customers: {topic: customers}\ntopology:\n  - from: {topic: orders}\n  - join: {table: customers, as: '{order: ., customer: $right}', type: left}\n  - to: {topic: out}\n";
        let app = parse_app(ok).expect("valid");
        assert_eq!(
            app.spec.tables["customers"].store_name("customers"),
            "customers"
        );
        let cases = [
            (
                "topology:\n  - from: {topic: o}\n  - join: {table: c, as: '.'}\n",
                "topology[1].join.table: no table \"c\": declare it in tables",
            ),
            (
                "tables:\n  d: {topic: d}\ntopology:\n  - from: {topic: o}\n  - join: {table: c, as: '.'}\n",
                "no table \"c\" in tables (it has d)",
            ),
            (
                "tables:\n  c: {topic: c}\ntopology:\n  - from: {topic: o}\n  - filter: '.ok'\n",
                "tables.c: no step uses this table",
            ),
            (
                "tables:\n  c: {topic: c}\ntopology:\n  - from: {topic: o}\n  - join: {table: c, key: '.id', as: '.'}\n",
                "topology[1].join.key: key picks the lookup key of a global table",
            ),
            (
                "tables:\n  c: {topic: c, key: json}\ntopology:\n  - from: {topic: o}\n  - join: {table: c, as: '.'}\n",
                "the key is string here but table \"c\"'s key is json",
            ),
            (
                "tables:\n  c: {topic: c}\ntopology:\n  - from: {topic: o}\n  - join: {table: c, as: ' '}\n",
                "topology[1].join.as: the jq expression is empty",
            ),
            (
                "tables:\n  c: {topic: c}\ntopology:\n  - from: {topic: o}\n  - join: {table: c, as: '.'}\n  - groupBy: '.x'\n  - join: {table: c, as: '.'}\n",
                "table \"c\" is joined on both sides of a groupBy (topology[1] and here)",
            ),
            (
                "tables:\n  c: {topic: o}\ntopology:\n  - from: {topic: o}\n  - join: {table: c, as: '.'}\n",
                "topology[0].from.topic: \"o\" is also the topic of table \"c\"",
            ),
            (
                "tables:\n  a: {topic: c}\n  b: {topic: c}\ntopology:\n  - from: {topic: o}\n  - join: {table: a, as: '.'}\n  - join: {table: b, as: '.'}\n",
                "tables.b.topic: table \"a\" reads \"c\" too",
            ),
            (
                "tables:\n  c: {topic: c, store: n}\ntopology:\n  - from: {topic: o}\n  - join: {table: c, as: '.'}\n  - groupBy: '.x'\n  - count: {store: n}\n",
                "topology[3].count.store: store \"n\" is defined twice",
            ),
            (
                "tables:\n  c: {topic: c, global: true, versioned: {history: 1d}}\ntopology:\n  - from: {topic: o}\n  - join: {table: c, as: '.'}\n",
                "tables.c.versioned: a global table keeps only each key's latest value",
            ),
            (
                "tables:\n  c: {topic: c, versioned: {history: 1d}}\n  a: {topic: a}\ntopology:\n  - from: {table: c}\n  - join: {table: a, as: '.'}\n",
                "topology[0].from.table: table \"c\" is versioned: so far a versioned table is only joined from a stream",
            ),
            (
                "tables:\n  c: {topic: c}\n  a: {topic: a, versioned: {history: 1d}}\ntopology:\n  - from: {table: c}\n  - join: {table: a, as: '.'}\n",
                "topology[1].join.table: table \"a\" is versioned",
            ),
            (
                "tables:\n  c: {topic: c}\ntopology:\n  - from: {topic: o}\n  - groupBy: '.u'\n  - window: {tumbling: 1m, grace: 0s}\n  - count: {store: n}\n  - join: {table: c, as: '.'}\n",
                "topology[4].join: the key is windowed here",
            ),
        ];
        for (text, want) in cases {
            let e = err(text);
            assert!(e.contains(want), "{text}\n  gave: {e}\n  want: {want}");
        }
        // A global table may be looked up by any key, on either side of a groupBy.
        parse_app("tables:\n  c: {topic: c, global: true, key: json}\ntopology:\n  - from: {topic: o}\n  - join: {table: c, key: '.country', as: '.'}\n  - groupBy: '.x'\n  - join: {table: c, as: '.'}\n").expect("valid");
        // A versioned table joins a stream.
        parse_app("tables:\n  c: {topic: c, versioned: {history: 1d}}\ntopology:\n  - from: {topic: o}\n  - join: {table: c, type: left, as: '.'}\n").expect("valid");
    }

    #[test]
    fn table_sources_and_table_joins_are_checked_where_they_are_written() {
        let t = "tables:\n  c: {topic: c}\n  a: {topic: a}\n  g: {topic: g, global: true}\n";
        let ok = "tables:\n  c: {topic: c}\n  a: {topic: a}\ntopology:\n  - from: {table: c}\n  - join: {table: a, type: outer, as: '{c: ., a: $right}', materialize: {store: ca}}\n  - to: {topic: out}\n";
        let app = parse_app(ok).expect("valid");
        let names: Vec<String> = crate::step::stores(&app.spec.topology)
            .iter()
            .map(|d| d.name.to_string())
            .collect();
        assert_eq!(names, ["ca"]);
        // What earlier versions wrote out (the default formats beside any table's) still reads,
        // and writes out the same way.
        let written = "tables:\n  c: {topic: c, key: i64, value: bytes}\n  a: {topic: a, key: i64}\ntopology:\n  - from: {table: c, key: string, value: json}\n  - join: {table: a, as: '.'}\n";
        let app = parse_app(written).expect("the defaults are let through");
        let again = serde_json::to_value(&app.spec.topology[0]).expect("serializes");
        assert_eq!(again["from"]["key"], "string");
        assert_eq!(again["from"]["value"], "json");
        let cases = [
            (
                format!(
                    "{t}topology:\n  - from: {{table: c, topic: x}}\n  - join: {{table: a, as: '.'}}\n"
                ),
                "topology[0].from: read a topic or a table, not both",
            ),
            (
                format!("{t}topology:\n  - from: {{}}\n"),
                "topology[0].from: give the topic to read",
            ),
            (
                format!("{t}topology:\n  - from: {{table: x}}\n"),
                "topology[0].from.table: no table \"x\"",
            ),
            (
                format!("{t}topology:\n  - from: {{table: g}}\n  - join: {{table: a, as: '.'}}\n"),
                "topology[0].from.table: table \"g\" is global",
            ),
            (
                format!(
                    "{t}topology:\n  - from: {{table: c, timestamp: '.t'}}\n  - join: {{table: a, as: '.'}}\n"
                ),
                "topology[0].from.timestamp: a table's updates keep their records' timestamps",
            ),
            (
                format!(
                    "{t}topology:\n  - from: {{table: c, value: string}}\n  - join: {{table: a, as: '.'}}\n"
                ),
                "topology[0].from.value: a table's formats are its own (tables.c.value is json): set tables.c.value",
            ),
            (
                format!(
                    "{t}topology:\n  - from: {{table: c}}\n  - filter: '.ok'\n  - join: {{table: a, as: '.'}}\n"
                ),
                "topology[1].filter: after a table source",
            ),
            (
                format!(
                    "{t}topology:\n  - from: {{table: c}}\n  - join: {{table: c, as: '.'}}\n  - join: {{table: a, as: '.'}}\n"
                ),
                "topology[1].join.table: table \"c\" is the source",
            ),
            (
                format!(
                    "{t}topology:\n  - from: {{table: c}}\n  - join: {{table: g, as: '.'}}\n  - join: {{table: a, as: '.'}}\n"
                ),
                "topology[1].join.table: table \"g\" is global",
            ),
            (
                "tables:\n  c: {topic: c}\n  a: {topic: a}\n  b: {topic: b}\ntopology:\n  - from: {table: c}\n  - join: {table: a, as: '.'}\n  - join: {table: b, as: '.'}\n".to_string(),
                "topology[1].join: one table-table join per topology for now",
            ),
            (
                format!(
                    "{t}topology:\n  - from: {{table: c}}\n  - join: {{stream: {{topic: s}}, within: 1m, as: '.'}}\n  - join: {{table: a, as: '.'}}\n"
                ),
                "topology[1].join.stream: a table joins tables",
            ),
            (
                format!(
                    "{t}topology:\n  - from: {{topic: o}}\n  - join: {{table: a, as: '.', materialize: {{store: m}}}}\n  - join: {{table: c, as: '.'}}\n"
                ),
                "topology[1].join.materialize: materialize keeps a table-table join's result",
            ),
            (
                format!(
                    "{t}topology:\n  - from: {{table: c}}\n  - join: {{table: a, as: '.', materialize: {{store: c}}}}\n"
                ),
                "topology[1].join.materialize.store: store \"c\" is defined twice",
            ),
        ];
        for (text, want) in cases {
            let e = err(&text);
            assert!(e.contains(want), "{text}\n  gave: {e}\n  want: {want}");
        }
    }

    #[test]
    fn stream_joins_are_checked_where_they_are_written() {
        let ok = "topology:\n  - from: {topic: orders}\n  - join: {stream: {topic: shipments, timestamp: '.at'}, within: 5m, grace: 1m, type: outer, as: '{order: ., shipment: $right}'}\n  - to: {topic: out}\n";
        let app = parse_app(ok).expect("valid");
        let Step::Join(j) = &app.spec.topology[1] else {
            panic!("a join");
        };
        assert_eq!(j.retention(), crate::Duration::from_millis(660_000));
        let s = "topology:\n  - from: {topic: o}\n";
        let cases = [
            (
                format!("{s}  - join: {{stream: {{topic: s}}, as: '.'}}\n"),
                "topology[1].join.within: a stream join needs within",
            ),
            (
                format!("{s}  - join: {{as: '.'}}\n"),
                "topology[1].join: a join has one of a table",
            ),
            (
                format!(
                    "tables:\n  c: {{topic: c}}\n{s}  - join: {{table: c, stream: {{topic: s}}, within: 1m, as: '.'}}\n"
                ),
                "a join has either a table",
            ),
            (
                format!(
                    "tables:\n  c: {{topic: c}}\n{s}  - join: {{table: c, within: 1m, as: '.'}}\n"
                ),
                "topology[1].join.within: within is for stream joins",
            ),
            (
                format!(
                    "tables:\n  c: {{topic: c}}\n{s}  - join: {{table: c, type: outer, as: '.'}}\n"
                ),
                "topology[1].join.type: a stream-table join is inner or left",
            ),
            (
                format!("{s}  - join: {{stream: {{topic: o}}, within: 1m, as: '.'}}\n"),
                "topology[1].join.stream.topic: \"o\" is also the topic of from",
            ),
            (
                format!(
                    "tables:\n  c: {{topic: s}}\n{s}  - join: {{table: c, as: '.'}}\n  - join: {{stream: {{topic: s}}, within: 1m, as: '.'}}\n"
                ),
                "\"s\" is also the topic of table \"c\"",
            ),
            (
                format!(
                    "{s}  - join: {{stream: {{topic: s}}, within: 1m, as: '.'}}\n  - groupBy: '.x'\n  - join: {{stream: {{topic: s}}, within: 1m, as: '.'}}\n"
                ),
                "topology[3].join.stream.topic: \"s\" is also joined at topology[1]",
            ),
            (
                format!("{s}  - join: {{stream: {{topic: s, key: json}}, within: 1m, as: '.'}}\n"),
                "topology[1].join.stream.key: the key is string here but the stream's key is json",
            ),
            (
                format!("{s}  - join: {{stream: {{topic: s}}, within: 1m, key: '.id', as: '.'}}\n"),
                "topology[1].join.key: key picks the lookup key of a global table",
            ),
            (
                format!(
                    "{s}  - join: {{stream: {{topic: s}}, within: 1m, materialize: {{store: m}}, as: '.'}}\n"
                ),
                "topology[1].join.materialize: materialize keeps a table-table join's result",
            ),
            (
                format!(
                    "{s}  - join: {{stream: {{topic: s, timestamp: ' '}}, within: 1m, as: '.'}}\n"
                ),
                "topology[1].join.stream.timestamp: the jq expression is empty",
            ),
            (
                format!(
                    "{s}  - join: {{stream: {{topic: s}}, within: 1m, store: j, type: left, as: '.'}}\n  - groupBy: '.x'\n  - count: {{store: j-outer}}\n"
                ),
                "topology[3].count.store: store \"j-outer\" is defined twice",
            ),
            (
                format!(
                    "{s}  - groupBy: '.u'\n  - window: {{tumbling: 1m, grace: 0s}}\n  - count: {{store: n}}\n  - join: {{stream: {{topic: s}}, within: 1m, as: '.'}}\n"
                ),
                "topology[4].join: the key is windowed here",
            ),
        ];
        for (text, want) in cases {
            let e = err(&text);
            assert!(e.contains(want), "{text}\n  gave: {e}\n  want: {want}");
        }
    }

    #[test]
    fn errors_name_the_field() {
        let e = err("topology:\n  - from: {topic: a}\n  - cont: {store: s}\n");
        assert!(
            e.contains("topology[1]") && e.contains("unknown variant `cont`"),
            "{e}"
        );
        let e = err("topology:\n  - from: {topic: a, value: xml}\n");
        assert!(e.contains("topology[0]") && e.contains("xml"), "{e}");
        let e = err("topology:\n  - filter: '.a'\n");
        assert!(
            e.contains("topology[0]") && e.contains("first step must be `from"),
            "{e}"
        );
        let e = err("topology:\n  - from: {topic: a}\n  - to: {topic: b}\n  - filter: '.a'\n");
        assert!(e.contains("topology[1]") && e.contains("last step"), "{e}");
        let e = err("topology:\n  - from: {topic: 'a b'}\n");
        assert!(e.contains("topology[0].from.topic"), "{e}");
        let e =
            err("topology:\n  - from: {topic: a}\n  - count: {store: s}\n  - count: {store: s}\n");
        assert!(
            e.contains("topology[2].count.store") && e.contains("twice"),
            "{e}"
        );
        let e = err("apiVersion: eddy.dev/v1\nkind: StatefulStreamApp\nspec: {topology: []}\n");
        assert!(
            e.contains("apiVersion") && e.contains("eddy.dev/v1alpha1"),
            "{e}"
        );
        let e = err(
            "apiVersion: eddy.dev/v1alpha1\nkind: StatefulStreamApp\nspec:\n  replicas: 2\n  numStandbyReplicas: -1\n  topology: [{from: {topic: a}}]\n",
        );
        assert!(e.contains("spec.numStandbyReplicas"), "{e}");
        for r in [-1, MAX_REPLICAS + 1, i32::MAX] {
            let e = err(&format!(
                "replicas: {r}\ntopology: [{{from: {{topic: a}}}}]\n"
            ));
            assert!(
                e.contains("replicas") && e.contains("must be 0 to 1000"),
                "{e}"
            );
        }
        for id in [".", ".."] {
            let e = err(&format!(
                "applicationId: \"{id}\"\ntopology: [{{from: {{topic: a}}}}]\n"
            ));
            assert!(
                e.contains("applicationId") && e.contains("state dir"),
                "{e}"
            );
            let e = err(&format!(
                "topology: [{{from: {{topic: a}}}}, {{count: {{store: \"{id}\"}}}}]\n"
            ));
            assert!(
                e.contains("topology[1].count.store") && e.contains("not a name"),
                "{e}"
            );
        }
        parse_app(&format!(
            "replicas: {MAX_REPLICAS}\ntopology: [{{from: {{topic: a}}}}]\n"
        ))
        .expect("the largest replicas is accepted");
        // More standbys than other pods: as many as fit, so scaling down is not refused.
        parse_app(
            "apiVersion: eddy.dev/v1alpha1\nkind: StatefulStreamApp\nspec:\n  replicas: 1\n  numStandbyReplicas: 1\n  topology: [{from: {topic: a}}]\n",
        )
        .expect("numStandbyReplicas >= replicas is accepted");
        let e = err("warmup: {maxWarmupReplicas: 0}\ntopology: [{from: {topic: a}}]\n");
        assert!(
            e.contains("warmup.maxWarmupReplicas") && e.contains("at least 1"),
            "{e}"
        );
        let e = err("warmup: {acceptableRecoveryLag: -1}\ntopology: [{from: {topic: a}}]\n");
        assert!(e.contains("warmup.acceptableRecoveryLag"), "{e}");
        parse_app("warmup: {maxWarmupReplicas: 1, acceptableRecoveryLag: 0}\ntopology: [{from: {topic: a}}]\n")
            .expect("the smallest warm-up settings are valid");
        let e = err(
            "processingGuarantee: exactly_once\ncommitIntervalMs: 30000\ntopology: [{from: {topic: a}}]\n",
        );
        assert!(
            e.contains("commitIntervalMs") && e.contains("transactionTimeoutMs (30000 ms)"),
            "{e}"
        );
        parse_app(
            "processingGuarantee: exactly_once\ncommitIntervalMs: 30000\ntransactionTimeoutMs: 60000\ntopology: [{from: {topic: a}}]\n",
        )
        .expect("a longer transaction timeout allows the interval");
        parse_app("commitIntervalMs: 60000\ntopology: [{from: {topic: a}}]\n")
            .expect("at-least-once has no transactions");
        let e = err("transactionTimeoutMs: 3600000\ntopology: [{from: {topic: a}}]\n");
        assert!(
            e.contains("transactionTimeoutMs") && e.contains("900000"),
            "{e}"
        );
        let e = err(
            "kafka: {properties: {transaction.timeout.ms: '5000'}}\ntopology: [{from: {topic: a}}]\n",
        );
        assert!(
            e.contains("spec.transactionTimeoutMs") || e.contains("transactionTimeoutMs instead"),
            "{e}"
        );
        let e = err("topology:\n  - from: {topic: a}\n  - groupBy: {key: '.a', nam: x}\n");
        assert!(
            e.contains("topology[1]") && e.contains("unknown field `nam`") && e.contains("name"),
            "{e}"
        );
        let e = err("topology: []\nprocessingGuarantee: exactly-once\n");
        assert!(
            e.contains("processingGuarantee") && e.contains("exactly_once"),
            "{e}"
        );
    }

    #[test]
    fn groupby_names_are_topic_names_and_unique() {
        let app = |steps: &str| {
            format!(
                "apiVersion: eddy.dev/v1alpha1\nkind: StatefulStreamApp\nmetadata: {{name: pv}}\nspec:\n  topology:\n  - from: {{topic: a}}\n{steps}"
            )
        };
        let ok = parse_app(&app(
            "  - groupBy: {key: '.u', name: by-user}\n  - count: {store: by-user}\n",
        ))
        .expect("a name may equal a store's: their topics differ");
        match &ok.spec.topology[1] {
            Step::GroupBy(g) => assert_eq!((g.expr(), g.name()), (".u", Some("by-user"))),
            other => panic!("expected groupBy, got {other:?}"),
        }

        let e = err(&app("  - groupBy: {key: '.u', name: 'by user'}\n"));
        assert!(
            e.starts_with("spec.topology[1].groupBy.name: ") && e.contains("' '"),
            "{e}"
        );
        let e = err(&app(
            "  - groupBy: {key: '.u', name: x}\n  - count: {store: c}\n  - groupBy: {key: '.v', name: x}\n",
        ));
        assert!(
            e.starts_with("spec.topology[3].groupBy.name: ")
                && e.contains("already the name of topology[1]")
                && e.contains("unique"),
            "{e}"
        );
        // A name that is another step's index takes the topic that step writes by default,
        // whichever comes first.
        let e = err(&app(
            "  - groupBy: {key: '.u', name: '3'}\n  - count: {store: c}\n  - groupBy: '.v'\n",
        ));
        assert!(
            e.starts_with("spec.topology[1].groupBy.name: ")
                && e.contains("<applicationId>-3-repartition")
                && e.contains("topology[3]'s groupBy writes by default"),
            "{e}"
        );
        let e = err(&app(
            "  - groupBy: '.u'\n  - count: {store: c}\n  - groupBy: {key: '.v', name: '1'}\n",
        ));
        assert!(
            e.starts_with("spec.topology[3].groupBy.name: ") && e.contains("topology[1]"),
            "{e}"
        );
        // Its own index is no collision: it is the default made explicit. A number is a name.
        parse_app(&app("  - groupBy: {key: '.u', name: '1'}\n")).expect("valid");
        let e = err(&app(
            "  - groupBy: '.u'\n  - count: {store: c}\n  - groupBy: {key: '.v', name: 1}\n",
        ));
        assert!(e.starts_with("spec.topology[3].groupBy.name: "), "{e}");
        let json: crate::StatefulStreamApp = serde_json::from_str(
            r#"{"apiVersion": "eddy.dev/v1alpha1", "kind": "StatefulStreamApp", "metadata": {"name": "pv"},
                "spec": {"topology": [{"from": {"topic": "a"}}, {"groupBy": {"key": ".u", "name": 1}}]}}"#,
        )
        .expect("a number is a name in JSON too");
        match &json.spec.topology[1] {
            Step::GroupBy(g) => assert_eq!(g.name(), Some("1")),
            other => panic!("expected groupBy, got {other:?}"),
        }
        let e = err(&app("  - groupBy: {key: '.u', name: [x]}\n"));
        assert!(
            e.contains("topology[1].groupBy") && e.contains("a name"),
            "{e}"
        );
    }

    #[test]
    fn evaluation_and_liveness_timeouts() {
        let app = |extra: &str| format!("{extra}\ntopology:\n  - from: {{topic: a}}\n");
        let spec = parse_app(&app("expressionTimeoutMs: 250\nlivenessTimeoutMs: 60000"))
            .expect("valid")
            .spec;
        assert_eq!(spec.expression_timeout_ms, Some(250));
        assert_eq!(spec.liveness_timeout_ms, Some(60_000));
        let e = err(&app("expressionTimeoutMs: 0"));
        assert!(
            e.contains("expressionTimeoutMs") && e.contains("at least 1"),
            "{e}"
        );
        let e = err(&app("livenessTimeoutMs: 5000"));
        assert!(
            e.contains("livenessTimeoutMs") && e.contains("at least 10000"),
            "{e}"
        );
        // The default liveness timeout (5 min) must exceed an expression timeout of 10 min.
        let e = err(&app("expressionTimeoutMs: 600000"));
        assert!(
            e.contains("livenessTimeoutMs") && e.contains("(600000)"),
            "{e}"
        );
        assert!(
            parse_app(&app(
                "expressionTimeoutMs: 600000\nlivenessTimeoutMs: 900000"
            ))
            .is_ok()
        );
    }

    const SECURED: &str = "topology: [{from: {topic: a}}]\nkafka:\n  bootstrapServers: k:9093\n";

    #[test]
    fn sasl_username_is_a_literal_or_a_secret_key_in_either_shape() {
        use crate::spec::{SaslMechanism, SecretKeyRef, ValueSource};
        let creds = |name: &str, key: &str| SecretKeyRef {
            name: name.into(),
            key: key.into(),
        };
        let read = |sasl: &str| {
            parse_app(&format!("{SECURED}  sasl: {sasl}\n"))
                .expect("valid")
                .spec
                .kafka
                .sasl
                .expect("sasl")
        };
        let s = read(
            "{mechanism: SCRAM-SHA-512, username: alice, password: {secretKeyRef: {name: c, key: p}}}",
        );
        assert_eq!(s.mechanism, SaslMechanism::ScramSha512);
        assert_eq!(s.username, ValueSource::Value("alice".into()));
        assert_eq!(s.password, creds("c", "p"));
        let s = read(
            "{mechanism: PLAIN, username: {secretKeyRef: {name: c, key: u}}, password: {name: c, key: p}, sendPasswordInClear: true}",
        );
        assert_eq!(s.username, ValueSource::Secret(creds("c", "u")));
        // Today's shape keeps working.
        let s = read(
            "{mechanism: SCRAM-SHA-256, username: {name: c, key: u}, password: {name: c, key: p}}",
        );
        assert_eq!(s.username, ValueSource::Secret(creds("c", "u")));
        // Serialized short, as before: the spec hash of existing apps does not change.
        let yaml = serde_yaml::to_string(&s).expect("serializable");
        assert!(yaml.contains("username:\n  name: c\n  key: u"), "{yaml}");
        let again: crate::spec::SaslSpec = serde_yaml::from_str(&yaml).expect("round trip");
        assert_eq!(again, s);
    }

    #[test]
    fn malformed_credentials_name_the_field_and_the_shape() {
        let e = err(&format!(
            "{SECURED}  sasl: {{mechanism: PLAIN, username: {{secret: c}}, password: {{name: c, key: p}}}}\n"
        ));
        assert!(
            e.contains("kafka.sasl.username") && e.contains("secretKeyRef"),
            "{e}"
        );
        let e = err(&format!(
            "{SECURED}  sasl: {{mechanism: PLAIN, username: u, password: hunter2}}\n"
        ));
        assert!(
            e.contains("kafka.sasl.password") && e.contains("a Secret key"),
            "{e}"
        );
        assert!(!e.contains("hunter2"), "the message repeats no value: {e}");
        let e = err(&format!(
            "{SECURED}  sasl: {{mechanism: GSSAPI, username: u, password: {{name: c, key: p}}}}\n"
        ));
        assert!(e.contains("SCRAM-SHA-512"), "{e}");
        let e = err(&format!(
            "{SECURED}  sasl: {{mechanism: PLAIN, username: '', password: {{name: c, key: p}}}}\n"
        ));
        assert!(e.contains("kafka.sasl.username: is empty"), "{e}");
        let e = err(&format!(
            "{SECURED}  tls: {{ca: {{name: '', key: ca.crt}}}}\n"
        ));
        assert!(e.contains("kafka.tls.ca"), "{e}");
    }

    #[test]
    fn a_plain_password_in_clear_is_refused_unless_the_app_says_so() {
        let sasl = "sasl: {mechanism: PLAIN, username: u, password: {name: c, key: p}";
        let e = err(&format!("{SECURED}  {sasl}}}\n"));
        assert!(
            e.contains("kafka.sasl.mechanism")
                && e.contains("in clear")
                && e.contains("sendPasswordInClear: true"),
            "{e}"
        );
        parse_app(&format!("{SECURED}  {sasl}, sendPasswordInClear: true}}\n")).expect("opted in");
        parse_app(&format!("{SECURED}  tls: {{}}\n  {sasl}}}\n")).expect("over TLS");
        let e = err(&format!(
            "{SECURED}  tls: {{}}\n  properties: {{security.protocol: sasl_plaintext}}\n  {sasl}}}\n"
        ));
        assert!(e.contains("in clear"), "the properties turn TLS off: {e}");
    }

    #[test]
    fn credentials_in_kafka_properties_are_refused_with_where_they_go() {
        for (property, instead) in [
            ("sasl.password", "kafka.sasl.password"),
            ("ssl.key.pem", "kafka.tls.key"),
            ("ssl.key.password", "kafka.tls.keyPassword"),
            ("sasl.oauthbearer.client.secret", "kafka.sasl"),
        ] {
            let e = err(&format!(
                "apiVersion: eddy.dev/v1alpha1\nkind: StatefulStreamApp\nmetadata: {{name: a}}\nspec:\n  kafka:\n    properties: {{{property}: s3cret}}\n  topology: [{{from: {{topic: a}}}}]\n"
            ));
            assert!(
                e.contains(&format!("spec.kafka.properties[\"{property}\"]"))
                    && e.contains("ConfigMap")
                    && e.contains(instead),
                "{e}"
            );
            assert!(!e.contains("s3cret"), "{e}");
        }
        // Settings that are no secrets stay allowed.
        parse_app(&format!(
            "{SECURED}  properties: {{security.protocol: ssl, ssl.ca.location: /ca.pem, sasl.username: u}}\n"
        ))
        .expect("no credential");
    }

    #[test]
    fn the_default_application_id_is_unique_per_namespace() {
        assert_eq!(application_id(Some("team-a"), "pv", None), "team-a.pv");
        assert_eq!(application_id(Some("team-b"), "pv", None), "team-b.pv");
        assert_eq!(application_id(Some("team-a"), "pv", Some("views")), "views");
        assert_eq!(application_id(None, "pv", None), "pv");
        // A valid Kafka topic prefix for the longest names Kubernetes allows a StatefulSet
        // to have (63-character namespace, 52-character name).
        let id = application_id(Some(&"n".repeat(63)), &"a.b-c".repeat(10), None);
        assert!(topics::check_name(&id).is_ok(), "{id}");
    }

    #[test]
    fn a_stored_spec_the_types_refuse_is_named_by_its_field() {
        let spec = serde_json::json!({
            "replicas": 1,
            "topology": [{"from": {"topic": "a"}}, {"groupBy": 42}],
        });
        let e = spec_from_json(&spec)
            .expect_err("a number is no expression")
            .to_string();
        assert!(
            e.contains("spec.topology[1].groupBy") && e.contains("expected a jq expression"),
            "{e}"
        );
        assert!(!e.contains(" at line "), "{e}");
        let spec = serde_json::json!({"replicas": "two", "topology": [{"from": {"topic": "a"}}]});
        let e = spec_from_json(&spec).expect_err("not a number").to_string();
        assert!(
            e.contains("spec.replicas") && e.contains("invalid type"),
            "{e}"
        );
        let ok = spec_from_json(&serde_json::json!({"topology": [{"from": {"topic": "a"}}]}));
        assert_eq!(ok.expect("valid").topology.len(), 1);
    }
}
