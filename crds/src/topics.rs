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
    Ok(())
}

/// What a sub-topology reads and which stores it holds: all that decides internal topics.
#[derive(Clone, Debug, PartialEq)]
pub struct SubLayout {
    pub source: String,
    /// True when the source is a repartition topic eddy creates.
    pub internal: bool,
    pub stores: Vec<StoreLayout>,
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
    use crate::Step;
    let decls = crate::step::stores(&spec.topology);
    let mut subs = Vec::new();
    let mut cur: Option<SubLayout> = None;
    for (i, step) in spec.topology.iter().enumerate() {
        match step {
            Step::From(f) => {
                cur = Some(SubLayout {
                    source: f.topic.clone(),
                    internal: false,
                    stores: Vec::new(),
                })
            }
            Step::GroupBy(g) => {
                subs.extend(cur.take());
                cur = Some(SubLayout {
                    source: repartition(application_id, i, g.name()),
                    internal: true,
                    stores: Vec::new(),
                });
            }
            _ => {
                if let Some(d) = decls.iter().find(|d| d.step == i) {
                    cur.iter_mut().for_each(|s| {
                        s.stores.push(StoreLayout {
                            name: d.name.to_string(),
                            kind: d.kind,
                        })
                    });
                }
            }
        }
    }
    subs.extend(cur);
    subs
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
    use crate::Step;
    let decls = crate::step::stores(&spec.topology);
    let mut out: Vec<InternalName> = Vec::new();
    for (step, s) in spec.topology.iter().enumerate() {
        let (topic, origin) = match s {
            Step::GroupBy(g) => (
                repartition(application_id, step, g.name()),
                Origin::Repartition {
                    step,
                    group_by: g.clone(),
                },
            ),
            _ => match decls.iter().find(|d| d.step == step) {
                Some(d) => (
                    changelog(application_id, &d.name),
                    Origin::Changelog {
                        step,
                        keyword: d.keyword,
                        store: d.name.to_string(),
                    },
                ),
                None => continue,
            },
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

/// The internal topics of an app, given the partition counts of its external source topics:
/// repartition topics get the partitions of the sub-topology that writes them, changelogs
/// those of the sub-topology whose tasks own the stores (one partition per task).
/// Returns the source topic that is missing, if one is.
pub fn plan(
    application_id: &str,
    subs: &[SubLayout],
    with_dead_letter: bool,
    partitions_of: impl Fn(&str) -> Option<i32>,
) -> Result<(Vec<InternalTopic>, Vec<i32>), String> {
    let mut out = Vec::new();
    let mut counts = Vec::new();
    let mut upstream = 0;
    for sub in subs {
        let n = if sub.internal {
            upstream
        } else {
            partitions_of(&sub.source).ok_or_else(|| sub.source.clone())?
        };
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
            plan("a", &subs, true, |t| (t == "in").then_some(6)).expect("planned");
        let names: Vec<(&str, i32)> = topics
            .iter()
            .map(|t| (t.name.as_str(), t.partitions))
            .collect();
        assert_eq!(
            names,
            [("a-1-repartition", 6), ("a-c-changelog", 6), ("a-dlq", 1)]
        );
        assert_eq!(counts, [6, 6]);
        assert_eq!(plan("a", &subs, false, |_| None), Err("in".to_string()));
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
        let (planned, _) = plan("a", &subs, true, |_| Some(1)).expect("planned");
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
