//! Names of the internal topics eddy creates for an application.

/// Compacted changelog of a store; partition = task partition.
pub fn changelog(application_id: &str, store: &str) -> String {
    format!("{application_id}-{store}-changelog")
}

/// Repartition topic written by the re-key at topology step `step` (0-based index).
pub fn repartition(application_id: &str, step: usize, name: Option<&str>) -> String {
    format!(
        "{application_id}-{}-repartition",
        repartition_id(step, name)
    )
}

/// What tells a repartition topic from the app's others: the step's `name`, so the topic
/// keeps its name when the topology is edited around the step; else the step's index, as
/// apps written before steps had names expect.
pub fn repartition_id(step: usize, name: Option<&str>) -> String {
    name.map_or_else(|| step.to_string(), str::to_string)
}

/// Dead-letter topic for records that `onError: deadLetter` sets aside.
pub fn dead_letter(application_id: &str) -> String {
    format!("{application_id}-dlq")
}

/// Kafka's rule for topic names, so a bad store or app name fails at start, not at create time.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 249 {
        return Err(format!("{name:?} must be 1 to 249 characters long"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "{name:?} contains {c:?}: only ASCII letters, digits, '.', '_' and '-' are allowed"
        ));
    }
    // Kafka refuses these too, and an app's or store's name is also a directory under the
    // state dir: `..` would put its state outside the volume.
    if name == "." || name == ".." {
        return Err(format!(
            "{name:?} is not a name: Kafka refuses \".\" and \"..\", and the state dir is named after it"
        ));
    }
    Ok(())
}

/// What a sub-topology reads and which stores it holds: all that decides internal topics.
#[derive(Clone, Debug, PartialEq)]
pub struct SubLayout {
    pub source: String,
    /// True when the source is a repartition topic eddy creates.
    pub internal: bool,
    /// The other topics the sub-topology's tasks read: the tables it joins (not global ones)
    /// and the other streams of its stream joins. Its tasks read the same partition of each as
    /// of the source, so all have the same partition count.
    pub joined: Vec<JoinedInput>,
    pub stores: Vec<StoreLayout>,
}

/// A topic read by a sub-topology's tasks beside its source: a table or another stream.
#[derive(Clone, Debug, PartialEq)]
pub struct JoinedInput {
    /// What it is, for messages: `table "customers"`, `stream "shipments"`.
    pub what: String,
    pub topic: String,
}

impl JoinedInput {
    pub fn table(name: &str, topic: &str) -> Self {
        Self {
            what: format!("table {name:?}"),
            topic: topic.to_string(),
        }
    }

    pub fn stream(topic: &str) -> Self {
        Self {
            what: format!("stream {topic:?}"),
            topic: topic.to_string(),
        }
    }
}

/// A store as its changelog sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct StoreLayout {
    pub name: String,
    pub kind: crate::StoreKind,
}

/// Kafka Streams' margin on a windowed changelog's `retention.ms` beyond the store's
/// retention (`windowstore.changelog.additional.retention.ms`), so clock drift between
/// brokers and stream time never deletes a window the store still holds.
pub const CHANGELOG_ADDITIONAL_RETENTION_MS: u64 = 86_400_000;

impl StoreLayout {
    /// The changelog's topic configuration: compacted, and for windows also deleted after
    /// the store's retention plus the margin.
    pub fn changelog_config(&self) -> Vec<(&'static str, String)> {
        match self.kind {
            crate::StoreKind::KeyValue => vec![("cleanup.policy", "compact".into())],
            crate::StoreKind::Window { retention } => vec![
                ("cleanup.policy", "compact,delete".into()),
                (
                    "retention.ms",
                    (retention
                        .as_millis()
                        .saturating_add(CHANGELOG_ADDITIONAL_RETENTION_MS))
                    .to_string(),
                ),
            ],
        }
    }
}

/// The sub-topologies of a declarative spec: a `groupBy` at step `i` ends one at its
/// repartition topic `repartition(app, i, name)` and starts the next one reading it.
pub fn layout(application_id: &str, spec: &crate::AppSpec) -> Vec<SubLayout> {
    use crate::{JoinStep, Step};
    let decls = crate::step::stores(&spec.topology);
    let mut subs = Vec::new();
    let mut cur: Option<SubLayout> = None;
    for (i, step) in spec.topology.iter().enumerate() {
        match step {
            Step::From(f) => {
                // A table source: its topic is read, into the table's store.
                let table = f
                    .table
                    .as_ref()
                    .and_then(|n| Some((n, spec.tables.get(n)?)));
                cur = Some(SubLayout {
                    source: table.map_or_else(|| f.topic.clone(), |(_, t)| t.topic.clone()),
                    internal: false,
                    joined: Vec::new(),
                    stores: table
                        .map(|(n, t)| StoreLayout {
                            name: t.store_name(n).to_string(),
                            kind: crate::StoreKind::KeyValue,
                        })
                        .into_iter()
                        .collect(),
                })
            }
            Step::GroupBy(g) => {
                subs.extend(cur.take());
                cur = Some(SubLayout {
                    source: repartition(application_id, i, g.name()),
                    internal: true,
                    joined: Vec::new(),
                    stores: Vec::new(),
                });
            }
            Step::Join(JoinStep {
                table: Some(name), ..
            }) => {
                let (Some(t), Some(sub)) = (spec.tables.get(name), cur.as_mut()) else {
                    continue;
                };
                for d in decls.iter().filter(|d| d.step == i) {
                    sub.stores.push(StoreLayout {
                        name: d.name.to_string(),
                        kind: d.kind,
                    });
                }
                let input = JoinedInput::table(name, &t.topic);
                if t.global || sub.joined.contains(&input) {
                    continue;
                }
                sub.joined.push(input);
                sub.stores.push(StoreLayout {
                    name: t.store_name(name).to_string(),
                    kind: crate::StoreKind::KeyValue,
                });
            }
            _ => {
                let Some(sub) = cur.as_mut() else { continue };
                if let Step::Join(JoinStep {
                    stream: Some(stream),
                    ..
                }) = step
                {
                    sub.joined.push(JoinedInput::stream(&stream.topic));
                }
                for d in decls.iter().filter(|d| d.step == i) {
                    sub.stores.push(StoreLayout {
                        name: d.name.to_string(),
                        kind: d.kind,
                    });
                }
            }
        }
    }
    subs.extend(cur);
    subs
}

/// The topics of the app's global tables: every worker reads all their partitions.
pub fn global_topics(spec: &crate::AppSpec) -> Vec<String> {
    spec.tables
        .values()
        .filter(|t| t.global)
        .map(|t| t.topic.clone())
        .collect()
}

/// Where an internal topic comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum Origin {
    /// Written by the `groupBy` at topology step `step`, read by the sub-topology after it.
    Repartition {
        step: usize,
        group_by: crate::GroupBy,
    },
    /// Changelog of the store that the `count` or `aggregate` at topology step `step` defines.
    Changelog {
        step: usize,
        keyword: &'static str,
        store: String,
    },
    /// Changelog of the store of `spec.tables.<table>` (not global: a global table's topic
    /// is its changelog).
    Table { table: String, store: String },
    /// Where `onError: deadLetter` sets bad records aside.
    DeadLetter,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Repartition { step, .. } => write!(f, "repartition, topology[{step}] groupBy"),
            Origin::Changelog {
                step,
                keyword,
                store,
            } => write!(f, "changelog of store {store}, topology[{step}] {keyword}"),
            Origin::Table { table, store } => {
                write!(f, "changelog of store {store}, tables.{table}")
            }
            Origin::DeadLetter => f.write_str("dead letters, onError: deadLetter"),
        }
    }
}

/// The name of an internal topic and the step it comes from.
#[derive(Clone, Debug, PartialEq)]
pub struct InternalName {
    pub topic: String,
    pub origin: Origin,
}

/// Every internal topic of an app, in topology order, with the step each comes from: the
/// names `layout` and `plan` give, without partition counts.
pub fn internal_names(application_id: &str, spec: &crate::AppSpec) -> Vec<InternalName> {
    use crate::{JoinStep, Step};
    let decls = crate::step::stores(&spec.topology);
    let mut out: Vec<InternalName> = Vec::new();
    for (step, s) in spec.topology.iter().enumerate() {
        let table = match s {
            Step::Join(JoinStep {
                table: Some(name), ..
            }) => Some(name),
            Step::From(f) => f.table.as_ref(),
            _ => None,
        };
        if table.is_some() {
            out.extend(
                decls
                    .iter()
                    .filter(|d| d.step == step)
                    .map(|d| InternalName {
                        topic: changelog(application_id, &d.name),
                        origin: Origin::Changelog {
                            step,
                            keyword: d.keyword,
                            store: d.name.to_string(),
                        },
                    }),
            );
        }
        let (topic, origin) = match (s, table) {
            (_, Some(name)) => match spec.tables.get(name) {
                Some(t)
                    if !t.global
                        && !out.iter().any(
                            |n| matches!(&n.origin, Origin::Table { table, .. } if table == name),
                        ) =>
                {
                    let store = t.store_name(name).to_string();
                    (
                        changelog(application_id, &store),
                        Origin::Table {
                            table: name.clone(),
                            store,
                        },
                    )
                }
                _ => continue,
            },
            (Step::GroupBy(g), _) => (
                repartition(application_id, step, g.name()),
                Origin::Repartition {
                    step,
                    group_by: g.clone(),
                },
            ),
            _ => {
                out.extend(
                    decls
                        .iter()
                        .filter(|d| d.step == step)
                        .map(|d| InternalName {
                            topic: changelog(application_id, &d.name),
                            origin: Origin::Changelog {
                                step,
                                keyword: d.keyword,
                                store: d.name.to_string(),
                            },
                        }),
                );
                continue;
            }
        };
        out.push(InternalName { topic, origin });
    }
    if spec.on_error == crate::OnError::DeadLetter {
        out.push(InternalName {
            topic: dead_letter(application_id),
            origin: Origin::DeadLetter,
        });
    }
    out
}

/// An internal topic an app needs.
#[derive(Clone, Debug, PartialEq)]
pub struct InternalTopic {
    pub name: String,
    pub partitions: i32,
    pub config: Vec<(&'static str, String)>,
}

/// Why the internal topics of an app cannot be planned.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PlanError {
    /// A topic the app reads does not exist.
    #[error("source topic {0:?} does not exist: create it, the app starts once it does")]
    Missing(String),
    /// A table or stream and the stream joining it (or two inputs joined by the same tasks)
    /// have different partition counts.
    #[error(
        "{what} (topic {topic:?}, {partitions} partitions) is joined with {other:?} ({other_partitions} partitions): a join reads the same partition of both, so they need the same partition count (co-partitioning, as in Kafka Streams); give {topic:?} {other_partitions} partitions, or repartition the stream with a groupBy before the join"
    )]
    NotCopartitioned {
        what: String,
        topic: String,
        partitions: i32,
        other: String,
        other_partitions: i32,
    },
}

/// The internal topics of an app, given the partition counts of its external source topics:
/// repartition topics get the partitions of the sub-topology that writes them (or of the
/// tables the reading sub-topology joins, as Kafka Streams sizes a repartition topic before a
/// join), changelogs those of the sub-topology whose tasks own the stores (one partition per
/// task). Global tables' topics (`globals`) only have to exist.
pub fn plan(
    application_id: &str,
    subs: &[SubLayout],
    globals: &[String],
    with_dead_letter: bool,
    partitions_of: impl Fn(&str) -> Option<i32>,
) -> Result<(Vec<InternalTopic>, Vec<i32>), PlanError> {
    let mut out = Vec::new();
    let mut counts = Vec::new();
    let mut upstream = 0;
    let count = |topic: &str| partitions_of(topic).ok_or_else(|| PlanError::Missing(topic.into()));
    for g in globals {
        count(g)?;
    }
    for sub in subs {
        // The stream (or the first table, for a repartitioned stream) fixes the count.
        let mut fixed = match sub.internal {
            true => None,
            false => Some((sub.source.clone(), count(&sub.source)?)),
        };
        for t in &sub.joined {
            let n = count(&t.topic)?;
            match &fixed {
                Some((other, m)) if *m != n => {
                    return Err(PlanError::NotCopartitioned {
                        what: t.what.clone(),
                        topic: t.topic.clone(),
                        partitions: n,
                        other: other.clone(),
                        other_partitions: *m,
                    });
                }
                Some(_) => {}
                None => fixed = Some((t.topic.clone(), n)),
            }
        }
        let n = fixed.map_or(upstream, |(_, n)| n);
        if sub.internal {
            out.push(InternalTopic {
                name: sub.source.clone(),
                partitions: n,
                config: vec![("cleanup.policy", "delete".into())],
            });
        }
        for store in &sub.stores {
            out.push(InternalTopic {
                name: changelog(application_id, &store.name),
                partitions: n,
                config: store.changelog_config(),
            });
        }
        counts.push(n);
        upstream = n;
    }
    if with_dead_letter {
        out.push(InternalTopic {
            name: dead_letter(application_id),
            partitions: 1,
            config: vec![("cleanup.policy", "delete".into())],
        });
    }
    Ok((out, counts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_of_a_rekeyed_app() {
        let app = crate::parse_app(
            "topology:\n- from: {topic: in}\n- groupBy: '.u'\n- count: {store: c}\n- to: {topic: out}\n",
        )
        .expect("valid");
        let subs = layout("a", &app.spec);
        assert_eq!(subs.len(), 2);
        let (topics, counts) =
            plan("a", &subs, &[], true, |t| (t == "in").then_some(6)).expect("planned");
        let names: Vec<(&str, i32)> = topics
            .iter()
            .map(|t| (t.name.as_str(), t.partitions))
            .collect();
        assert_eq!(
            names,
            [("a-1-repartition", 6), ("a-c-changelog", 6), ("a-dlq", 1)]
        );
        assert_eq!(counts, [6, 6]);
        assert_eq!(
            plan("a", &subs, &[], false, |_| None),
            Err(PlanError::Missing("in".into()))
        );
    }

    #[test]
    fn a_joined_table_is_read_by_the_tasks_of_its_join_with_as_many_partitions() {
        let app = crate::parse_app(
            "tables:\n  c: {topic: customers, store: cs}\n  g: {topic: countries, global: true}\ntopology:\n- from: {topic: orders}\n- join: {table: g, key: '.country', as: '.'}\n- groupBy: '.customer'\n- join: {table: c, as: '.'}\n- to: {topic: out}\n",
        )
        .expect("valid");
        let subs = layout("a", &app.spec);
        assert_eq!(subs[0].joined, []);
        assert_eq!(subs[1].joined, [JoinedInput::table("c", "customers")]);
        assert_eq!(subs[1].stores[0].name, "cs");
        let globals = global_topics(&app.spec);
        assert_eq!(globals, ["countries"]);
        // The repartition topic before the join gets the table's partitions, not the
        // stream's.
        let counts = |t: &str| match t {
            "orders" => Some(6),
            "customers" => Some(4),
            "countries" => Some(1),
            _ => None,
        };
        let (topics, tasks) = plan("a", &subs, &globals, false, counts).expect("planned");
        let names: Vec<(&str, i32)> = topics
            .iter()
            .map(|t| (t.name.as_str(), t.partitions))
            .collect();
        assert_eq!(names, [("a-2-repartition", 4), ("a-cs-changelog", 4)]);
        assert_eq!(tasks, [6, 4]);
        let names: Vec<String> = internal_names("a", &app.spec)
            .iter()
            .map(|n| format!("{} ({})", n.topic, n.origin))
            .collect();
        assert_eq!(
            names,
            [
                "a-2-repartition (repartition, topology[2] groupBy)",
                "a-cs-changelog (changelog of store cs, tables.c)"
            ]
        );
        // A missing global topic is a missing source.
        assert_eq!(
            plan("a", &subs, &globals, false, |t| (t != "countries")
                .then_some(4)),
            Err(PlanError::Missing("countries".into()))
        );
    }

    #[test]
    fn a_table_joined_by_a_stream_with_other_partition_counts_is_refused() {
        let app = crate::parse_app(
            "tables:\n  c: {topic: customers}\ntopology:\n- from: {topic: orders}\n- join: {table: c, as: '.'}\n",
        )
        .expect("valid");
        let subs = layout("a", &app.spec);
        let e = plan("a", &subs, &[], false, |t| {
            Some(if t == "orders" { 6 } else { 4 })
        })
        .expect_err("not co-partitioned");
        assert_eq!(
            e,
            PlanError::NotCopartitioned {
                what: "table \"c\"".into(),
                topic: "customers".into(),
                partitions: 4,
                other: "orders".into(),
                other_partitions: 6
            }
        );
        let m = e.to_string();
        assert!(m.contains("give \"customers\" 6 partitions"), "{m}");
    }

    #[test]
    fn a_stream_join_reads_the_other_stream_and_keeps_both_sides_in_window_stores() {
        let app = crate::parse_app(
            "topology:\n- from: {topic: orders}\n- groupBy: '.customer'\n- join: {stream: {topic: shipments}, within: 5m, grace: 1m, type: left, as: '.'}\n- to: {topic: out}\n",
        )
        .expect("valid");
        let subs = layout("a", &app.spec);
        assert_eq!(subs[1].joined, [JoinedInput::stream("shipments")]);
        let window = crate::StoreKind::Window {
            retention: crate::Duration::from_millis(660_000),
        };
        let stores: Vec<(&str, crate::StoreKind)> = subs[1]
            .stores
            .iter()
            .map(|s| (s.name.as_str(), s.kind))
            .collect();
        assert_eq!(
            stores,
            [
                ("join-2-left", window),
                ("join-2-right", window),
                ("join-2-outer", crate::StoreKind::KeyValue)
            ]
        );
        // The repartition topic takes the other stream's partitions; a stream of another
        // count than the source is refused, naming it.
        let (topics, tasks) = plan("a", &subs, &[], false, |t| match t {
            "orders" => Some(6),
            "shipments" => Some(3),
            _ => None,
        })
        .expect("planned");
        assert_eq!(tasks, [6, 3]);
        assert!(topics.iter().all(|t| t.partitions == 3), "{topics:?}");
        let names: Vec<String> = internal_names("a", &app.spec)
            .iter()
            .map(|n| format!("{} ({})", n.topic, n.origin))
            .collect();
        assert_eq!(
            names,
            [
                "a-1-repartition (repartition, topology[1] groupBy)",
                "a-join-2-left-changelog (changelog of store join-2-left, topology[2] join)",
                "a-join-2-right-changelog (changelog of store join-2-right, topology[2] join)",
                "a-join-2-outer-changelog (changelog of store join-2-outer, topology[2] join)",
            ]
        );
        let app = crate::parse_app(
            "topology:\n- from: {topic: orders}\n- join: {stream: {topic: shipments}, within: 5m, store: j, as: '.'}\n",
        )
        .expect("valid");
        let subs = layout("a", &app.spec);
        assert_eq!(subs[0].stores.len(), 2, "an inner join holds nothing back");
        let e = plan("a", &subs, &[], false, |t| {
            Some(if t == "orders" { 6 } else { 4 })
        })
        .expect_err("not co-partitioned")
        .to_string();
        assert!(
            e.starts_with("stream \"shipments\" (topic \"shipments\", 4 partitions) is joined with \"orders\" (6 partitions)"),
            "{e}"
        );
    }

    #[test]
    fn a_table_table_join_reads_both_tables_into_their_stores() {
        let app = crate::parse_app(
            "tables:\n  c: {topic: customers}\n  a: {topic: accounts, store: acc}\ntopology:\n- from: {table: c}\n- join: {table: a, type: left, as: '.', materialize: {store: ca}}\n- to: {topic: out}\n",
        )
        .expect("valid");
        let subs = layout("x", &app.spec);
        assert_eq!(subs.len(), 1);
        assert_eq!(subs[0].source, "customers");
        assert_eq!(subs[0].joined, [JoinedInput::table("a", "accounts")]);
        let stores: Vec<&str> = subs[0].stores.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(stores, ["c", "ca", "acc"]);
        let names: Vec<String> = internal_names("x", &app.spec)
            .iter()
            .map(|n| format!("{} ({})", n.topic, n.origin))
            .collect();
        assert_eq!(
            names,
            [
                "x-c-changelog (changelog of store c, tables.c)",
                "x-ca-changelog (changelog of store ca, topology[1] join)",
                "x-acc-changelog (changelog of store acc, tables.a)",
            ]
        );
        let e = plan("x", &subs, &[], false, |t| {
            Some(if t == "customers" { 2 } else { 3 })
        })
        .expect_err("not co-partitioned")
        .to_string();
        assert!(
            e.starts_with("table \"a\" (topic \"accounts\", 3 partitions)"),
            "{e}"
        );
    }

    #[test]
    fn named_groupbys_name_their_repartition_topics() {
        let app = crate::parse_app(
            "onError: deadLetter\ntopology:\n- from: {topic: in}\n- filter: '.ok'\n- groupBy: {key: '.u', name: by-user}\n- count: {store: c}\n- groupBy: '.v'\n- aggregate: {store: s, initial: '0', add: '$agg + 1'}\n",
        )
        .expect("valid");
        let subs = layout("a", &app.spec);
        let sources: Vec<&str> = subs.iter().map(|s| s.source.as_str()).collect();
        assert_eq!(sources, ["in", "a-by-user-repartition", "a-4-repartition"]);
        let names: Vec<String> = internal_names("a", &app.spec)
            .iter()
            .map(|n| format!("{} ({})", n.topic, n.origin))
            .collect();
        assert_eq!(
            names,
            [
                "a-by-user-repartition (repartition, topology[2] groupBy)",
                "a-c-changelog (changelog of store c, topology[3] count)",
                "a-4-repartition (repartition, topology[4] groupBy)",
                "a-s-changelog (changelog of store s, topology[5] aggregate)",
                "a-dlq (dead letters, onError: deadLetter)",
            ]
        );
        // The same names as the plan the operator and the worker create topics from.
        let (planned, _) = plan("a", &subs, &[], true, |_| Some(1)).expect("planned");
        let mut planned: Vec<&str> = planned.iter().map(|t| t.name.as_str()).collect();
        let mut listed: Vec<&str> = names
            .iter()
            .map(|n| n.split(' ').next().unwrap_or(""))
            .collect();
        planned.sort();
        listed.sort();
        assert_eq!(planned, listed);
    }
}
