//! From the steps of an app file to sub-topologies. A re-key (`groupBy`) ends a sub-topology
//! at a repartition topic and starts the next one reading it, as in Kafka Streams; each
//! sub-topology runs as one task per partition of its source topic.

use crate::expr::{Expr, ExprError};
use crate::processor::Processor;
use crate::steps;
use crate::window::{Segments, Windows};
use eddy_crds::spec::AppSpec;
use eddy_crds::step::Step;
use eddy_crds::{Format, topics};
use std::sync::Arc;
use std::time::Duration;

/// Makes a fresh processor for each task.
pub type ProcessorSupplier = Arc<dyn Fn() -> Box<dyn Processor> + Send + Sync>;

/// Where a sub-topology reads from.
#[derive(Clone, Debug, PartialEq)]
pub struct Source {
    pub topic: String,
    pub key_format: Format,
    pub value_format: Format,
    /// True for repartition topics, which eddy creates and owns.
    pub internal: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct StoreDef {
    pub name: String,
    pub in_memory: bool,
    pub key_format: Format,
    pub value_format: Format,
    /// Index of the processor that receives the store's updates when the cache flushes.
    pub forward_to: Option<usize>,
    /// Set for a window or session store: its windows and how long it keeps them.
    pub window: Option<WindowDef>,
    /// Read by range (`KeyValueStore::range`): the record cache keeps its keys in order.
    /// Window stores always do.
    pub ordered: bool,
    /// Set for a versioned store ([`crate::versioned`]): how long it keeps each key's history.
    pub versioned: Option<eddy_crds::Duration>,
    /// Its values start with a timestamp ([`crate::window::with_timestamp`]): a table's, a
    /// time or sliding window's.
    pub stamped: bool,
    /// The engine's own buffer (a stream join's windows and waiting records, a suppression
    /// buffer), not the state of a step a user named: queries do not read it.
    pub internal: bool,
}

/// What makes a store a window or session store.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowDef {
    pub windows: Windows,
    pub retention: eddy_crds::Duration,
}

impl WindowDef {
    /// How the store is cut into segments on disk.
    pub fn segments(&self) -> Segments {
        Segments::for_retention(self.retention, self.windows.schema())
    }
}

impl StoreDef {
    /// A key-value store for custom processors (in RocksDB, changelogged, not forwarding its
    /// updates anywhere).
    pub fn key_value(name: &str, key_format: Format, value_format: Format) -> Self {
        Self {
            name: name.to_string(),
            in_memory: false,
            key_format,
            value_format,
            forward_to: None,
            window: None,
            ordered: false,
            versioned: None,
            stamped: false,
            internal: false,
        }
    }

    /// A window store of windows of `size`, each kept `retention` after its start
    /// ([`crate::processor::Context::window_store`]).
    pub fn window(
        name: &str,
        key_format: Format,
        value_format: Format,
        size: eddy_crds::Duration,
        retention: eddy_crds::Duration,
    ) -> Self {
        let windows = Windows::Time(crate::window::TimeWindows::new(
            size,
            size,
            eddy_crds::Duration::ZERO,
        ));
        Self {
            window: Some(WindowDef { windows, retention }),
            ..Self::key_value(name, key_format, value_format)
        }
    }

    /// A session store, each session kept `retention` after its end
    /// ([`crate::processor::Context::session_store`]).
    pub fn session(
        name: &str,
        key_format: Format,
        value_format: Format,
        retention: eddy_crds::Duration,
    ) -> Self {
        let windows = Windows::Session { gap: 1, grace: 0 };
        Self {
            window: Some(WindowDef { windows, retention }),
            ..Self::key_value(name, key_format, value_format)
        }
    }

    /// Keep it in memory, restored in full from its changelog at every start.
    pub fn in_memory(mut self) -> Self {
        self.in_memory = true;
        self
    }

    /// A versioned store ([`crate::versioned::VersionedStore`]) keeping each key's history for
    /// `history`.
    pub fn versioned(
        name: &str,
        key_format: Format,
        value_format: Format,
        history: eddy_crds::Duration,
    ) -> Self {
        Self {
            versioned: Some(history),
            ..Self::key_value(name, key_format, value_format).ordered()
        }
    }

    /// The store of table `name` of `spec.tables`: versioned if the table is; else, when its
    /// updates go on to a table-table join (`forwarded`), each value carries its record's
    /// timestamp (the joined result's), as [`crate::steps::join::TableSource`] writes it.
    pub fn table(name: &str, t: &eddy_crds::TableSpec, forwarded: bool) -> Self {
        let store = t.store_name(name);
        match &t.versioned {
            Some(v) => Self::versioned(store, t.key, t.value, v.history),
            None => Self {
                stamped: forwarded,
                ..Self::key_value(store, t.key, t.value)
            },
        }
    }

    /// The engine's own buffer, not queryable.
    pub fn internal(mut self) -> Self {
        self.internal = true;
        self
    }

    /// Read by range ([`crate::processor::KeyValueStore::range`]).
    pub fn ordered(mut self) -> Self {
        self.ordered = true;
        self
    }

    /// The store's kind, as its changelog's configuration follows it.
    pub fn kind(&self) -> eddy_crds::StoreKind {
        match self.window {
            Some(w) => eddy_crds::StoreKind::Window {
                retention: w.retention,
            },
            None => eddy_crds::StoreKind::KeyValue,
        }
    }
}

/// A topic a sub-topology writes to (besides changelogs).
#[derive(Clone, Debug, PartialEq)]
pub struct SinkDef {
    pub topic: String,
    /// Repartition topics get as many partitions as the sub-topology that writes them reads.
    pub internal: bool,
}

/// One topic a sub-topology's tasks read (the same partition as the task's): the source, and
/// the tables it joins. Its records go to the processor `entry` and on along `next`.
#[derive(Clone, Debug, PartialEq)]
pub struct Input {
    pub source: Source,
    /// The processor its records go to first; None if it has none.
    pub entry: Option<usize>,
    /// The entry processor sets each record's event time (`from.timestamp`, Kafka Streams'
    /// `TimestampExtractor`): the task's stream time, and so stream-time punctuation, follows
    /// the times it gives instead of the input records' Kafka timestamps.
    pub extracts_time: bool,
    /// The table of `spec.tables` this input materializes, if it is one.
    pub table: Option<String>,
}

/// A processor of a sub-topology: how to make one per task, its name and the stores it uses
/// (what `eddy-worker check` draws), and where what it forwards goes.
#[derive(Clone)]
pub struct Node {
    pub name: String,
    pub stores: Vec<String>,
    pub supplier: ProcessorSupplier,
    /// The processor its output goes to; None ends the chain.
    pub next: Option<usize>,
}

/// A sub-topology: its inputs, and its processors as a graph. Each input's records enter at
/// its entry processor and go on along `next` (Kafka Streams' source nodes and child
/// processors).
#[derive(Clone)]
pub struct SubTopology {
    pub id: u32,
    /// `inputs[0]` is the source whose partitions are the tasks; the others (tables) have as
    /// many partitions.
    pub inputs: Vec<Input>,
    pub processors: Vec<Node>,
    pub stores: Vec<StoreDef>,
    pub sinks: Vec<SinkDef>,
    /// The last processor of the chain being built, that [`Self::processor`] appends to.
    tail: Option<usize>,
}

impl SubTopology {
    /// A sub-topology of custom processors, for applications embedding eddy.
    pub fn new(id: u32, source: Source) -> Self {
        Self {
            id,
            inputs: vec![Input {
                source,
                entry: None,
                extracts_time: false,
                table: None,
            }],
            processors: Vec::new(),
            stores: Vec::new(),
            sinks: Vec::new(),
            tail: None,
        }
    }

    /// The source: its partitions are the sub-topology's tasks.
    pub fn source(&self) -> &Source {
        &self.inputs[0].source
    }

    /// Append a processor to the chain of the last input added: it receives what the
    /// processor before it forwards (or the input's records, if it is the first).
    pub fn processor(mut self, p: impl Fn() -> Box<dyn Processor> + Send + Sync + 'static) -> Self {
        let i = self.processors.len();
        self.processors.push(Node {
            name: format!("processor-{i}"),
            stores: Vec::new(),
            supplier: Arc::new(p),
            next: None,
        });
        match self.tail {
            Some(t) => self.processors[t].next = Some(i),
            None => {
                if let Some(input) = self.inputs.last_mut() {
                    input.entry = Some(i);
                }
            }
        }
        self.tail = Some(i);
        self
    }

    /// Name the processor added last, and say which stores it uses (what `eddy-worker check`
    /// shows).
    pub fn named(mut self, name: impl Into<String>, stores: &[&str]) -> Self {
        if let Some(n) = self.processors.last_mut() {
            n.name = name.into();
            n.stores = stores.iter().map(|s| s.to_string()).collect();
        }
        self
    }

    /// Another topic the tasks read, co-partitioned with the source; the processors added
    /// after this start its own chain.
    pub fn input(mut self, source: Source) -> Self {
        // A store forwarding to "the next processor" of a chain that ended has nowhere to go.
        let end = Some(self.processors.len());
        for s in self.stores.iter_mut().filter(|s| s.forward_to == end) {
            s.forward_to = None;
        }
        self.inputs.push(Input {
            source,
            entry: None,
            extracts_time: false,
            table: None,
        });
        self.tail = None;
        self
    }

    pub fn store(mut self, store: StoreDef) -> Self {
        self.stores.push(store);
        self
    }

    pub fn sink(mut self, topic: &str) -> Self {
        self.sinks.push(SinkDef {
            topic: topic.to_string(),
            internal: false,
        });
        self
    }
}

impl std::fmt::Debug for SubTopology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubTopology")
            .field("id", &self.id)
            .field("inputs", &self.inputs)
            .field(
                "processors",
                &self
                    .processors
                    .iter()
                    .map(|n| (&n.name, n.next))
                    .collect::<Vec<_>>(),
            )
            .field("stores", &self.stores)
            .field("sinks", &self.sinks)
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("topology[{step}]: {cause}")]
    Expr { step: usize, cause: ExprError },
    #[error("topology[0]: the first step must be `from: {{topic: ...}}`")]
    NoSource,
    #[error("topology[{step}].window: {message}")]
    Window { step: usize, message: String },
    #[error("topology[{step}].suppress: suppress comes right after a windowed aggregation")]
    Suppress { step: usize },
    #[error("topology[{step}].join: no table {table:?} in tables")]
    NoTable { step: usize, table: String },
}

/// The application's sub-topologies, in data-flow order, and its global tables.
#[derive(Clone, Debug, Default)]
pub struct Topology {
    pub subtopologies: Vec<SubTopology>,
    /// Tables every task looks up whatever its partition ([`crate::global`]).
    pub globals: Vec<crate::global::GlobalTable>,
}

impl Topology {
    pub fn stores(&self) -> impl Iterator<Item = &StoreDef> {
        self.subtopologies.iter().flat_map(|s| s.stores.iter())
    }

    /// Compile the declarative steps of a spec.
    pub fn from_spec(application_id: &str, spec: &AppSpec) -> Result<Topology, TopologyError> {
        let Some(Step::From(from)) = spec.topology.first() else {
            return Err(TopologyError::NoSource);
        };
        let mut subs = Vec::new();
        // `from: {table}`: the table's topic, in its formats.
        let source_table = from
            .table
            .as_ref()
            .and_then(|n| Some((n.as_str(), spec.tables.get(n)?)));
        let (topic, mut kf, mut vf) = match source_table {
            Some((_, t)) => (t.topic.clone(), t.key, t.value),
            None => (from.topic.clone(), from.key_format(), from.value_format()),
        };
        let mut cur = SubTopology::new(
            0,
            Source {
                topic,
                key_format: kf,
                value_format: vf,
                internal: false,
            },
        );
        if let Some((name, t)) = source_table {
            let source = steps::join::TableSource::new(name, t, true);
            cur = cur
                .processor(move || Box::new(source.clone()))
                .named(format!("table-{name}"), &[t.store_name(name)])
                .store(StoreDef::table(name, t, true));
            cur.inputs[0].table = Some(name.to_string());
        }
        let budget = Duration::from_millis(
            spec.expression_timeout_ms
                .unwrap_or(eddy_crds::manifest::DEFAULT_EXPRESSION_TIMEOUT_MS),
        );
        let compile = |step: usize, src: &str, vars: &[&str]| {
            Expr::compile(src, vars)
                .map(|e| e.with_time_budget(budget))
                .map_err(|source| TopologyError::Expr {
                    step,
                    cause: source,
                })
        };
        if let Some(src) = &from.timestamp {
            let e = compile(0, src, &steps::VARS)?;
            cur = cur
                .processor(move || Box::new(steps::Timestamp(e.clone())))
                .named("from.timestamp-0", &[]);
            cur.inputs[0].extracts_time = true;
        }
        // The tables the current sub-topology joins: read by its tasks, beside its source
        // (with the table-table join their updates go to).
        let mut tables: Vec<(&str, Option<usize>)> = Vec::new();
        // The other streams of the current sub-topology's stream joins.
        let mut streams: Vec<JoinedStream> = Vec::new();
        let mut globals: Vec<crate::global::GlobalTable> = Vec::new();
        // The window the next aggregation is per, and whether keys are windowed results.
        let mut window: Option<WindowDef> = None;
        let mut windowed = false;
        // The last windowed aggregation: its store and windows (for suppress).
        let mut last_windowed: Option<(String, Windows)> = None;
        for (i, step) in spec.topology.iter().enumerate().skip(1) {
            let fold = match step {
                Step::From(_) => return Err(TopologyError::NoSource),
                Step::Filter(src) => {
                    let e = compile(i, src, &steps::VARS)?;
                    cur = cur
                        .processor(move || Box::new(steps::Filter(e.clone())))
                        .named(format!("filter-{i}"), &[]);
                    continue;
                }
                Step::Map(src) => {
                    let e = compile(i, src, &steps::VARS)?;
                    cur = cur
                        .processor(move || Box::new(steps::Map(e.clone())))
                        .named(format!("map-{i}"), &[]);
                    vf = Format::Json;
                    continue;
                }
                Step::GroupBy(g) => {
                    let e = compile(i, g.expr(), &steps::VARS)?;
                    let topic = topics::repartition(application_id, i, g.name());
                    let (key_format, value_format) = (g.format(), vf);
                    let t = topic.clone();
                    cur = cur.processor(move || {
                        Box::new(steps::GroupBy {
                            expr: e.clone(),
                            key_format,
                            value_format,
                            topic: t.clone(),
                        })
                    });
                    cur = cur.named(format!("groupBy-{i}"), &[]);
                    cur.sinks.push(SinkDef {
                        topic: topic.clone(),
                        internal: true,
                    });
                    let next = SubTopology::new(
                        cur.id + 1,
                        Source {
                            topic,
                            key_format,
                            value_format,
                            internal: true,
                        },
                    );
                    let done = std::mem::replace(&mut cur, next);
                    subs.push(with_inputs(
                        done,
                        spec,
                        std::mem::take(&mut tables),
                        std::mem::take(&mut streams),
                    ));
                    kf = key_format;
                    windowed = false;
                    last_windowed = None;
                    continue;
                }
                Step::Join(j) => {
                    if let Some(stream) = &j.stream {
                        let prefix = j.store_prefix(i);
                        let kind = j.kind;
                        let within = j.within.unwrap_or(eddy_crds::Duration::ZERO);
                        let names = [
                            format!("{prefix}-left"),
                            format!("{prefix}-right"),
                            format!("{prefix}-outer"),
                        ];
                        let outer = (kind != eddy_crds::JoinType::Inner).then(|| names[2].clone());
                        let join = steps::stream_join::StreamStreamJoin::new(
                            stream.topic.clone(),
                            [
                                steps::stream_join::Side {
                                    store: names[0].clone(),
                                    value_format: vf,
                                    outer: outer.is_some(),
                                },
                                steps::stream_join::Side {
                                    store: names[1].clone(),
                                    value_format: stream.value,
                                    outer: kind == eddy_crds::JoinType::Outer,
                                },
                            ],
                            outer.clone(),
                            kf,
                            within.millis_i64(),
                            j.grace.unwrap_or_default().millis_i64(),
                            compile(i, &j.as_, &steps::JOIN_VARS)?,
                        );
                        let uses: Vec<&str> = names[..2 + usize::from(outer.is_some())]
                            .iter()
                            .map(String::as_str)
                            .collect();
                        cur = cur
                            .processor(move || Box::new(join.clone()))
                            .named(format!("join-{i}"), &uses);
                        // The window stores' "windows" are instants: a record's timestamp.
                        let size = within.max(eddy_crds::Duration::from_millis(1));
                        for name in &names[..2] {
                            cur = cur.store(
                                StoreDef::window(name, kf, Format::Bytes, size, j.retention())
                                    .internal(),
                            );
                        }
                        if let Some(name) = outer {
                            cur = cur.store(
                                StoreDef::key_value(&name, Format::Bytes, Format::Bytes)
                                    .ordered()
                                    .internal(),
                            );
                        }
                        let timestamp = match &stream.timestamp {
                            Some(e) => Some(compile(i, e, &steps::VARS)?),
                            None => None,
                        };
                        streams.push(JoinedStream {
                            step: i,
                            source: Source {
                                topic: stream.topic.clone(),
                                key_format: stream.key,
                                value_format: stream.value,
                                internal: false,
                            },
                            timestamp,
                            join: cur.processors.len() - 1,
                        });
                        vf = Format::Json;
                        continue;
                    }
                    let Some(table) = j.table.as_ref().and_then(|t| spec.tables.get(t)) else {
                        return Err(TopologyError::NoTable {
                            step: i,
                            table: j.table.clone().unwrap_or_default(),
                        });
                    };
                    let name = j.table.as_deref().unwrap_or_default();
                    let store = table.store_name(name).to_string();
                    if let Some((left, t)) = source_table {
                        let join = steps::join::TableTableJoin {
                            right_topic: table.topic.clone(),
                            stores: [t.store_name(left).to_string(), store.clone()],
                            value_formats: [t.value, table.value],
                            key_format: kf,
                            joiner: compile(i, &j.as_, &steps::JOIN_VARS)?,
                            kind: j.kind,
                            materialize: j.materialize.as_ref().map(|m| m.store.clone()),
                        };
                        let mut uses = join.stores.to_vec();
                        uses.extend(join.materialize.clone());
                        let uses: Vec<&str> = uses.iter().map(String::as_str).collect();
                        let materialize = join.materialize.clone();
                        cur = cur
                            .processor(move || Box::new(join.clone()))
                            .named(format!("join-{i}"), &uses);
                        if let Some(m) = materialize {
                            cur = cur.store(StoreDef::key_value(&m, kf, Format::Json));
                        }
                        tables.push((name, Some(cur.processors.len() - 1)));
                        vf = Format::Json;
                        continue;
                    }
                    if table.global {
                        if !globals.iter().any(|g| g.name == name) {
                            globals.push(crate::global::GlobalTable {
                                name: name.to_string(),
                                store: store.clone(),
                                topic: table.topic.clone(),
                                key_format: table.key,
                                value_format: table.value,
                            });
                        }
                    } else if !tables.iter().any(|(t, _)| *t == name) {
                        tables.push((name, None));
                    }
                    let join = steps::join::StreamTableJoin {
                        store,
                        global: table.global,
                        key: match &j.key {
                            Some(k) => Some(compile(i, k, &steps::VARS)?),
                            None => None,
                        },
                        key_format: table.key,
                        value_format: table.value,
                        joiner: compile(i, &j.as_, &steps::JOIN_VARS)?,
                        left: j.kind == eddy_crds::JoinType::Left,
                        history: table.history_ms(),
                    };
                    let uses = [join.store.clone()];
                    cur = cur
                        .processor(move || Box::new(join.clone()))
                        .named(format!("join-{i}"), &[&uses[0]]);
                    vf = Format::Json;
                    continue;
                }
                Step::Window(w) => {
                    let bad = |message| TopologyError::Window { step: i, message };
                    window = Some(WindowDef {
                        windows: Windows::new(w.kind().map_err(bad)?, w.grace),
                        retention: w.retention().map_err(bad)?,
                    });
                    continue;
                }
                Step::Suppress(_) => {
                    let Some((agg_store, windows)) = last_windowed.clone() else {
                        return Err(TopologyError::Suppress { step: i });
                    };
                    let buffer = eddy_crds::step::suppress_store(&agg_store);
                    let (name, key_format, value_format) = (buffer.clone(), kf, vf);
                    cur = cur.processor(move || {
                        Box::new(steps::suppress::Suppress::new(
                            name.clone(),
                            windows.schema(),
                            windows.close_after_end(),
                            key_format,
                            value_format,
                        ))
                    });
                    cur = cur.named(format!("suppress-{i}"), &[&buffer]);
                    // On disk whatever the aggregation's store: see `eddy_crds::step::stores`.
                    cur = cur.store(StoreDef {
                        name: buffer,
                        in_memory: false,
                        key_format: Format::Bytes,
                        value_format: Format::Bytes,
                        forward_to: None,
                        window: None,
                        ordered: true,
                        versioned: None,
                        stamped: false,
                        internal: true,
                    });
                    continue;
                }
                Step::To(to) => {
                    let session =
                        matches!(last_windowed, Some((_, Windows::Session { .. }))) && windowed;
                    let (topic, inner_key_format, value_format) =
                        (to.topic.clone(), kf, to.value.unwrap_or(vf));
                    let key_format = to
                        .key
                        .unwrap_or(if windowed { Format::Windowed } else { kf });
                    cur = cur.processor(move || {
                        Box::new(steps::To {
                            topic: topic.clone(),
                            key_format,
                            inner_key_format,
                            value_format,
                            session,
                        })
                    });
                    cur = cur.named(format!("to-{i}"), &[]).sink(&to.topic);
                    continue;
                }
                Step::Count(c) => (&c.store, c.in_memory, Format::I64, steps::Fold::Count),
                Step::Aggregate(a) => (
                    &a.store,
                    a.in_memory,
                    Format::Json,
                    steps::Fold::Aggregate {
                        initial: compile(i, &a.initial, &steps::VARS)?,
                        add: compile(i, &a.add, &steps::AGG_VARS)?,
                        merge: match &a.merge {
                            Some(m) => Some(compile(i, m, &steps::MERGE_VARS)?),
                            None => None,
                        },
                    },
                ),
                // A reduce keeps the values' format.
                Step::Reduce(r) => (
                    &r.store,
                    r.in_memory,
                    vf,
                    steps::Fold::Reduce {
                        with: compile(i, &r.with, &steps::AGG_VARS)?,
                        format: vf,
                    },
                ),
            };
            let (store, in_memory, value_format, fold) = fold;
            let (key_format, name, def) = (kf, store.clone(), window.take());
            windowed = def.is_some();
            last_windowed = def.map(|d| (store.clone(), d.windows));
            cur = match def.map(|d| d.windows) {
                Some(Windows::Time(windows)) => cur.processor(move || {
                    Box::new(steps::window::WindowedAggregation::new(
                        name.clone(),
                        key_format,
                        windows,
                        fold.clone(),
                    ))
                }),
                Some(Windows::Sliding { size, grace }) => cur.processor(move || {
                    Box::new(steps::sliding::SlidingAggregation::new(
                        name.clone(),
                        key_format,
                        size,
                        grace,
                        fold.clone(),
                    ))
                }),
                Some(Windows::Session { gap, grace }) => cur.processor(move || {
                    Box::new(steps::session::SessionAggregation::new(
                        name.clone(),
                        key_format,
                        gap,
                        grace,
                        fold.clone(),
                    ))
                }),
                None => cur.processor(move || {
                    Box::new(steps::Aggregation {
                        store: name.clone(),
                        key_format,
                        fold: fold.clone(),
                    })
                }),
            };
            cur = cur.named(format!("{}-{i}", step.keyword()), &[store]);
            // The store's updates go on to the step after the aggregation.
            let forward_to = Some(cur.processors.len());
            cur = cur.store(StoreDef {
                name: store.clone(),
                in_memory,
                key_format,
                value_format,
                forward_to,
                window: def,
                ordered: false,
                versioned: None,
                // Time and sliding windows keep the largest record time with the value.
                stamped: def.is_some_and(|d| !matches!(d.windows, Windows::Session { .. })),
                internal: false,
            });
            vf = value_format;
        }
        subs.push(with_inputs(cur, spec, tables, streams));
        Ok(Topology {
            subtopologies: subs,
            globals,
        })
    }
}

/// The other stream of a stream join, read by the tasks of the join's sub-topology.
struct JoinedStream {
    step: usize,
    source: Source,
    timestamp: Option<Expr>,
    /// The join processor its records go to (after `timestamp`, if any).
    join: usize,
}

/// Add the inputs a sub-topology's tasks read beside its source: the tables it joins, each
/// into its store, and the other streams of its stream joins, each into its join.
fn with_inputs(
    mut sub: SubTopology,
    spec: &AppSpec,
    tables: Vec<(&str, Option<usize>)>,
    streams: Vec<JoinedStream>,
) -> SubTopology {
    for (name, join) in tables {
        let Some(t) = spec.tables.get(name) else {
            continue;
        };
        let source = steps::join::TableSource::new(name, t, join.is_some());
        sub = sub
            .input(Source {
                topic: t.topic.clone(),
                key_format: t.key,
                value_format: t.value,
                internal: false,
            })
            .processor(move || Box::new(source.clone()))
            .named(format!("table-{name}"), &[t.store_name(name)])
            .store(StoreDef::table(name, t, join.is_some()));
        if let Some(input) = sub.inputs.last_mut() {
            input.table = Some(name.to_string());
        }
        if let Some(n) = sub.processors.last_mut() {
            n.next = join;
        }
    }
    for s in streams {
        sub = sub.input(s.source);
        match s.timestamp {
            Some(e) => {
                sub = sub
                    .processor(move || Box::new(steps::Timestamp(e.clone())))
                    .named(format!("join-{}.stream.timestamp", s.step), &[]);
                if let Some(n) = sub.processors.last_mut() {
                    n.next = Some(s.join);
                }
                if let Some(input) = sub.inputs.last_mut() {
                    input.extracts_time = true;
                }
            }
            None => {
                if let Some(input) = sub.inputs.last_mut() {
                    input.entry = Some(s.join);
                }
            }
        }
    }
    sub
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Data;

    #[test]
    fn a_rekey_splits_the_topology_at_a_repartition_topic() {
        let app = eddy_crds::parse_app(
            "topology:\n- from: {topic: page-views}\n- filter: '.status == 200'\n- groupBy: '.user'\n- count: {store: views}\n- to: {topic: out, value: i64}\n",
        )
        .expect("valid");
        let t = Topology::from_spec("pv", &app.spec).expect("compiles");
        assert_eq!(t.subtopologies.len(), 2);
        let (a, b) = (&t.subtopologies[0], &t.subtopologies[1]);
        assert_eq!(a.source().topic, "page-views");
        assert_eq!(a.processors.len(), 2);
        assert_eq!(a.sinks[0].topic, "pv-2-repartition");
        assert_eq!(b.source().topic, "pv-2-repartition");
        assert_eq!(b.source().key_format, Format::String);
        assert_eq!(b.stores[0].name, "views");
        assert_eq!(b.stores[0].forward_to, Some(1));
        assert_eq!(b.sinks[0].topic, "out");
    }

    /// A sink that drops what it is sent and refuses times after `refuse_after`, as a topic
    /// with `message.timestamp.after.max.ms` would.
    struct NoSink {
        refuse_after: i64,
    }
    impl crate::processor::Sink for NoSink {
        fn send(
            &mut self,
            _: &str,
            _: Option<i32>,
            _: Option<&[u8]>,
            _: Option<&[u8]>,
            _: i64,
        ) -> Result<(), crate::processor::ProcessError> {
            Ok(())
        }
        fn check_timestamp(&self, t: i64) -> Result<(), String> {
            if t > self.refuse_after {
                Err("out refuses it".into())
            } else {
                Ok(())
            }
        }
    }

    /// `expressionTimeoutMs` reaches the expressions: a record that loops fails after it,
    /// as a bad record.
    #[test]
    fn expressions_get_the_time_budget_of_the_spec() {
        use crate::processor::{Context, ProcessError};
        use crate::record::Record;
        let app = eddy_crds::parse_app(
            "expressionTimeoutMs: 50\ntopology:\n- from: {topic: a, value: json}\n- filter: '.step as $s | .n | until(. > 10; . + $s)'\n",
        )
        .expect("valid");
        let t = Topology::from_spec("x", &app.spec).expect("compiles");
        let mut filter = (t.subtopologies[0].processors[0].supplier)();
        let (mut sink, mut out) = (
            NoSink {
                refuse_after: i64::MAX,
            },
            Vec::new(),
        );
        let mut ctx = Context {
            stores: &mut [],
            db: None,
            global: None,
            sink: &mut sink,
            out: &mut out,
            topic: None,
        };
        let looping = Record::new(
            None,
            Some(Data::raw(br#"{"n": 0, "step": 0}"#, Format::Json)),
            0,
        );
        match filter.process(looping, &mut ctx) {
            Err(ProcessError::BadRecord(m)) => {
                assert!(m.contains("exceeded its time budget of 50 ms"), "{m}")
            }
            other => panic!("{other:?}"),
        }
    }

    /// What `to` sent, in order.
    type Sent = (Option<Vec<u8>>, Option<Vec<u8>>, i64);
    struct Recorder(Vec<Sent>);
    impl crate::processor::Sink for Recorder {
        fn send(
            &mut self,
            _: &str,
            _: Option<i32>,
            key: Option<&[u8]>,
            value: Option<&[u8]>,
            ts: i64,
        ) -> Result<(), crate::processor::ProcessError> {
            self.0
                .push((key.map(<[u8]>::to_vec), value.map(<[u8]>::to_vec), ts));
            Ok(())
        }
    }

    #[test]
    fn a_tumbling_count_counts_per_window_drops_late_records_and_writes_windowed_keys() {
        use crate::cache::{Backend, StoreState};
        use crate::processor::{Context, ProcessError};
        use crate::record::Record;
        use crate::store::MemoryStore;
        let app = eddy_crds::parse_app(
            "topology:\n- from: {topic: logins, timestamp: '.at'}\n- filter: '.ok | not'\n- groupBy: '.user'\n- window: {tumbling: 10s, grace: 5s}\n- count: {store: failures}\n- map: '{user: $key, n: ., from: $window.start}'\n- to: {topic: out}\n",
        )
        .expect("valid");
        let t = Topology::from_spec("x", &app.spec).expect("compiles");
        // Sub-topology 0: the event time comes from the value.
        let mut ts = (t.subtopologies[0].processors[0].supplier)();
        let mut sent = Recorder(Vec::new());
        let mut out = Vec::new();
        let r = Record::new(None, Some(Data::raw(br#"{"at": 12345}"#, Format::Json)), 1);
        ts.process(
            r,
            &mut Context {
                stores: &mut [],
                db: None,
                global: None,
                sink: &mut sent,
                out: &mut out,
                topic: None,
            },
        )
        .expect("timestamp");
        assert_eq!(out[0].timestamp, 12345);
        let bad = Record::new(None, Some(Data::raw(br#"{"at": "soon"}"#, Format::Json)), 1);
        match ts.process(
            bad,
            &mut Context {
                stores: &mut [],
                db: None,
                global: None,
                sink: &mut sent,
                out: &mut out,
                topic: None,
            },
        ) {
            Err(ProcessError::BadRecord(m)) => assert!(m.contains("expected milliseconds"), "{m}"),
            other => panic!("{other:?}"),
        }
        // A time before 1970, or one a written topic refuses, is a bad record too (the
        // producer would stamp the first with the send time; the broker refuses the second).
        for (at, why) in [("-5", "before 1970"), ("99999", "out refuses it")] {
            let r = Record::new(
                None,
                Some(Data::raw(
                    format!(r#"{{"at": {at}}}"#).as_bytes(),
                    Format::Json,
                )),
                1,
            );
            let mut ctx = Context {
                stores: &mut [],
                db: None,
                global: None,
                sink: &mut NoSink {
                    refuse_after: 20_000,
                },
                out: &mut out,
                topic: None,
            };
            match ts.process(r, &mut ctx) {
                Err(ProcessError::BadRecord(m)) => assert!(m.contains(why), "{m}"),
                other => panic!("{at}: {other:?}"),
            }
        }
        assert_eq!(out.len(), 1, "a refused time forwards nothing");
        // Sub-topology 1: the windowed count.
        let sub = &t.subtopologies[1];
        let def = &sub.stores[0];
        let w = def.window.expect("a window store");
        assert_eq!(w.windows.to_string(), "tumbling 10s, grace 5s");
        assert_eq!(w.retention, eddy_crds::Duration::from_millis(15_000));
        let mut store = StoreState::for_def(
            def,
            "x-failures-changelog".into(),
            Backend::Memory(MemoryStore::default()),
        );
        let mut procs: Vec<_> = sub.processors.iter().map(|n| (n.supplier)()).collect();
        let mut counts = Vec::new();
        for (user, at) in [
            ("a", 1_000),
            ("a", 9_999),
            ("b", 10_000),
            ("a", 21_000),
            ("a", 15_000),
            ("a", 5_000),
        ] {
            let r = Record::new(
                Some(Data::raw(user.as_bytes(), Format::String)),
                Some(Data::raw(b"{}", Format::Json)),
                at,
            );
            let mut ctx = Context {
                stores: std::slice::from_mut(&mut store),
                db: None,
                global: None,
                sink: &mut sent,
                out: &mut out,
                topic: None,
            };
            match procs[0].process(r, &mut ctx) {
                Ok(()) => {}
                Err(ProcessError::Skip(m)) => {
                    assert!(m.contains("late record") && at == 5_000, "{at}: {m}");
                    continue;
                }
                Err(e) => panic!("{e}"),
            }
            for d in store.take_dirty() {
                let r = store.downstream(&d);
                let (inner, window) = w.windows.schema().split(&d.key).expect("window key");
                let n = r.value.as_ref().expect("count").to_bytes(Format::I64);
                let n = i64::from_be_bytes(n.expect("bytes")[..].try_into().expect("8 bytes"));
                counts.push((String::from_utf8_lossy(inner).to_string(), window.start, n));
                assert_eq!(r.window, Some(window));
                let mut next = Vec::new();
                let mut ctx = Context {
                    stores: &mut [],
                    db: None,
                    global: None,
                    sink: &mut sent,
                    out: &mut next,
                    topic: None,
                };
                procs[1].process(r, &mut ctx).expect("map");
                let mut ctx = Context {
                    stores: &mut [],
                    db: None,
                    global: None,
                    sink: &mut sent,
                    out: &mut out,
                    topic: None,
                };
                procs[2].process(next.remove(0), &mut ctx).expect("to");
            }
        }
        // 15_000 is 6 s behind stream time 21_000: window [10s, 20s) ends at 20_000 > 21_000 - 5_000,
        // so it still counts; 5_000's window ended at 10_000, closed.
        assert_eq!(
            counts,
            [
                ("a".into(), 0, 1),
                ("a".into(), 0, 2),
                ("b".into(), 10_000, 1),
                ("a".into(), 20_000, 1),
                ("a".into(), 10_000, 1)
            ]
        );
        let (key, value, _) = &sent.0[0];
        let mut windowed = b"a".to_vec();
        windowed.extend_from_slice(&0i64.to_be_bytes());
        assert_eq!(
            key.as_deref(),
            Some(windowed.as_slice()),
            "Kafka Streams' TimeWindowedSerializer layout"
        );
        assert_eq!(
            value.as_deref(),
            Some(&br#"{"user":"a","n":1,"from":0}"#[..])
        );
    }

    #[test]
    fn windowed_keys_are_written_as_to_key_says() {
        use crate::window::{Window, encode_key};
        let w = Window { start: 10, end: 20 };
        let k = Data::raw(b"u1", Format::String);
        assert_eq!(
            encode_key(Format::Json, &k, Format::String, w, false).expect("json"),
            br#"{"key":"u1","start":10,"end":20}"#
        );
        assert_eq!(
            encode_key(Format::String, &k, Format::String, w, false).expect("string"),
            b"[u1@10/20]"
        );
        let n = Data::raw(&7i64.to_be_bytes(), Format::I64);
        let mut expected = 7i64.to_be_bytes().to_vec();
        expected.extend_from_slice(&10i64.to_be_bytes());
        assert_eq!(
            encode_key(Format::Windowed, &n, Format::I64, w, false).expect("windowed"),
            expected
        );
        assert_eq!(
            encode_key(Format::String, &n, Format::I64, w, false).expect("string"),
            b"[7@10/20]"
        );
    }

    /// The other stream of a stream join is a second input of the joining sub-topology: its
    /// records reach the join (through its timestamp extractor), which keeps both sides'
    /// window stores and the store of records waiting for a partner.
    #[test]
    fn a_stream_join_reads_the_other_stream_into_the_same_join() {
        let app = eddy_crds::parse_app(
            "topology:\n- from: {topic: orders}\n- groupBy: '.customer'\n- join: {stream: {topic: shipments, timestamp: '.at'}, within: 5m, grace: 1m, type: left, as: '.'}\n- to: {topic: out}\n",
        )
        .expect("valid");
        let t = Topology::from_spec("a", &app.spec).expect("compiles");
        let sub = &t.subtopologies[1];
        let names: Vec<&str> = sub.processors.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["join-2", "to-3", "join-2.stream.timestamp"]);
        let inputs: Vec<(&str, Option<usize>, bool)> = sub
            .inputs
            .iter()
            .map(|i| (i.source.topic.as_str(), i.entry, i.extracts_time))
            .collect();
        assert_eq!(
            inputs,
            [
                ("a-1-repartition", Some(0), false),
                ("shipments", Some(2), true)
            ]
        );
        assert_eq!(sub.processors[2].next, Some(0), "extracted, then joined");
        assert_eq!(
            sub.processors[0].stores,
            ["join-2-left", "join-2-right", "join-2-outer"]
        );
        let stores: Vec<(&str, bool, bool)> = sub
            .stores
            .iter()
            .map(|s| (s.name.as_str(), s.window.is_some(), s.ordered))
            .collect();
        assert_eq!(
            stores,
            [
                ("join-2-left", true, false),
                ("join-2-right", true, false),
                ("join-2-outer", false, true)
            ]
        );
        assert_eq!(
            sub.stores[0].window.map(|w| w.retention),
            Some(eddy_crds::Duration::from_millis(660_000))
        );
    }

    /// Every app in examples/ is valid and compiles.
    #[test]
    fn the_examples_compile() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).expect("examples/") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "yaml") {
                let text = std::fs::read_to_string(&path).expect("readable");
                let app = eddy_crds::parse_app(&text)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                Topology::from_spec("x", &app.spec)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                seen += 1;
            }
        }
        assert!(seen >= 3, "found {seen} examples");
    }

    #[test]
    fn a_named_rekey_writes_and_reads_the_named_topic() {
        let app = eddy_crds::parse_app(
            "topology:\n- from: {topic: page-views}\n- groupBy: {key: '.user', name: by-user}\n- count: {store: views}\n",
        )
        .expect("valid");
        let t = Topology::from_spec("pv", &app.spec).expect("compiles");
        assert_eq!(t.subtopologies[0].sinks[0].topic, "pv-by-user-repartition");
        assert_eq!(t.subtopologies[1].source().topic, "pv-by-user-repartition");
    }

    #[test]
    fn a_bad_expression_names_its_step() {
        let app = eddy_crds::parse_app("topology:\n- from: {topic: a}\n- filter: '.a ==('\n")
            .expect("parses");
        let e = Topology::from_spec("x", &app.spec)
            .expect_err("bad jq")
            .to_string();
        assert!(e.starts_with("topology[1]:") && e.contains(".a =="), "{e}");
    }
}
