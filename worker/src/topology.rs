//! From the steps of an app file to sub-topologies. A re-key (`groupBy`) ends a sub-topology
//! at a repartition topic and starts the next one reading it, as in Kafka Streams; each
//! sub-topology runs as one task per partition of its source topic.

use crate::expr::{Expr, ExprError};
use crate::processor::Processor;
use crate::steps;
use eddy_crds::spec::{AppSpec, Step};
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
}

/// A topic a sub-topology writes to (besides changelogs).
#[derive(Clone, Debug, PartialEq)]
pub struct SinkDef {
    pub topic: String,
    /// Repartition topics get as many partitions as the sub-topology that writes them reads.
    pub internal: bool,
}

#[derive(Clone)]
pub struct SubTopology {
    pub id: u32,
    pub source: Source,
    pub processors: Vec<ProcessorSupplier>,
    pub stores: Vec<StoreDef>,
    pub sinks: Vec<SinkDef>,
}

impl SubTopology {
    /// A sub-topology of custom processors, for applications embedding eddy.
    pub fn new(id: u32, source: Source) -> Self {
        Self {
            id,
            source,
            processors: Vec::new(),
            stores: Vec::new(),
            sinks: Vec::new(),
        }
    }

    pub fn processor(mut self, p: impl Fn() -> Box<dyn Processor> + Send + Sync + 'static) -> Self {
        self.processors.push(Arc::new(p));
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
            .field("source", &self.source)
            .field("processors", &self.processors.len())
            .field("stores", &self.stores)
            .field("sinks", &self.sinks)
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("topology[{step}]: {source}")]
    Expr {
        step: usize,
        #[source]
        source: ExprError,
    },
    #[error("topology[0]: the first step must be `from: {{topic: ...}}`")]
    NoSource,
}

/// The application's sub-topologies, in data-flow order.
#[derive(Clone, Debug)]
pub struct Topology {
    pub subtopologies: Vec<SubTopology>,
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
        let mut cur = SubTopology::new(
            0,
            Source {
                topic: from.topic.clone(),
                key_format: from.key,
                value_format: from.value,
                internal: false,
            },
        );
        let (mut kf, mut vf) = (from.key, from.value);
        let budget = Duration::from_millis(
            spec.expression_timeout_ms
                .unwrap_or(eddy_crds::manifest::DEFAULT_EXPRESSION_TIMEOUT_MS),
        );
        let compile = |step: usize, src: &str, vars: &[&str]| {
            Expr::compile(src, vars)
                .map(|e| e.with_time_budget(budget))
                .map_err(|source| TopologyError::Expr { step, source })
        };
        for (i, step) in spec.topology.iter().enumerate().skip(1) {
            match step {
                Step::From(_) => return Err(TopologyError::NoSource),
                Step::Filter(src) => {
                    let e = compile(i, src, &["key", "ts"])?;
                    cur = cur.processor(move || Box::new(steps::Filter(e.clone())));
                }
                Step::Map(src) => {
                    let e = compile(i, src, &["key", "ts"])?;
                    cur = cur.processor(move || Box::new(steps::Map(e.clone())));
                    vf = Format::Json;
                }
                Step::GroupBy(g) => {
                    let e = compile(i, g.expr(), &["key", "ts"])?;
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
                    subs.push(std::mem::replace(&mut cur, next));
                    kf = key_format;
                }
                Step::Count(c) => {
                    let (store, key_format) = (c.store.clone(), kf);
                    cur = cur.processor(move || {
                        Box::new(steps::Count {
                            store: store.clone(),
                            key_format,
                        })
                    });
                    vf = Format::I64;
                    cur.stores.push(StoreDef {
                        name: c.store.clone(),
                        in_memory: c.in_memory,
                        key_format: kf,
                        value_format: vf,
                        forward_to: Some(cur.processors.len()),
                    });
                }
                Step::Aggregate(a) => {
                    let initial = compile(i, &a.initial, &["key", "ts"])?;
                    let add = compile(i, &a.add, &["key", "ts", "agg"])?;
                    let (store, key_format) = (a.store.clone(), kf);
                    cur = cur.processor(move || {
                        Box::new(steps::Aggregate {
                            store: store.clone(),
                            key_format,
                            initial: initial.clone(),
                            add: add.clone(),
                        })
                    });
                    vf = Format::Json;
                    cur.stores.push(StoreDef {
                        name: a.store.clone(),
                        in_memory: a.in_memory,
                        key_format: kf,
                        value_format: vf,
                        forward_to: Some(cur.processors.len()),
                    });
                }
                Step::To(to) => {
                    let (topic, key_format, value_format) = (
                        to.topic.clone(),
                        to.key.unwrap_or(kf),
                        to.value.unwrap_or(vf),
                    );
                    cur = cur.processor(move || {
                        Box::new(steps::To {
                            topic: topic.clone(),
                            key_format,
                            value_format,
                        })
                    });
                    cur = cur.sink(&to.topic);
                }
            }
        }
        subs.push(cur);
        Ok(Topology {
            subtopologies: subs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rekey_splits_the_topology_at_a_repartition_topic() {
        let app = eddy_crds::parse_app(
            "topology:\n- from: {topic: page-views}\n- filter: '.status == 200'\n- groupBy: '.user'\n- count: {store: views}\n- to: {topic: out, value: i64}\n",
        )
        .expect("valid");
        let t = Topology::from_spec("pv", &app.spec).expect("compiles");
        assert_eq!(t.subtopologies.len(), 2);
        let (a, b) = (&t.subtopologies[0], &t.subtopologies[1]);
        assert_eq!(a.source.topic, "page-views");
        assert_eq!(a.processors.len(), 2);
        assert_eq!(a.sinks[0].topic, "pv-2-repartition");
        assert_eq!(b.source.topic, "pv-2-repartition");
        assert_eq!(b.source.key_format, Format::String);
        assert_eq!(b.stores[0].name, "views");
        assert_eq!(b.stores[0].forward_to, Some(1));
        assert_eq!(b.sinks[0].topic, "out");
    }

    /// `expressionTimeoutMs` reaches the expressions: a record that loops fails after it,
    /// as a bad record.
    #[test]
    fn expressions_get_the_time_budget_of_the_spec() {
        use crate::processor::{Context, ProcessError, Sink};
        use crate::record::{Data, Record};
        struct NoSink;
        impl Sink for NoSink {
            fn send(
                &mut self,
                _: &str,
                _: Option<i32>,
                _: Option<&[u8]>,
                _: Option<&[u8]>,
                _: i64,
            ) -> Result<(), ProcessError> {
                Ok(())
            }
        }
        let app = eddy_crds::parse_app(
            "expressionTimeoutMs: 50\ntopology:\n- from: {topic: a, value: json}\n- filter: '.step as $s | .n | until(. > 10; . + $s)'\n",
        )
        .expect("valid");
        let t = Topology::from_spec("x", &app.spec).expect("compiles");
        let mut filter = (t.subtopologies[0].processors[0])();
        let (mut sink, mut out) = (NoSink, Vec::new());
        let mut ctx = Context {
            stores: &mut [],
            db: None,
            sink: &mut sink,
            out: &mut out,
        };
        let looping = Record {
            key: None,
            value: Some(Data::raw(br#"{"n": 0, "step": 0}"#, Format::Json)),
            timestamp: 0,
        };
        match filter.process(looping, &mut ctx) {
            Err(ProcessError::BadRecord(m)) => {
                assert!(m.contains("exceeded its time budget of 50 ms"), "{m}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_named_rekey_writes_and_reads_the_named_topic() {
        let app = eddy_crds::parse_app(
            "topology:\n- from: {topic: page-views}\n- groupBy: {key: '.user', name: by-user}\n- count: {store: views}\n",
        )
        .expect("valid");
        let t = Topology::from_spec("pv", &app.spec).expect("compiles");
        assert_eq!(t.subtopologies[0].sinks[0].topic, "pv-by-user-repartition");
        assert_eq!(t.subtopologies[1].source.topic, "pv-by-user-repartition");
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
