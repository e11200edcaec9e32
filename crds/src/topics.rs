//! Names of the internal topics eddy creates for an application.

/// Compacted changelog of a store; partition = task partition.
pub fn changelog(application_id: &str, store: &str) -> String {
    format!("{application_id}-{store}-changelog")
}

/// Repartition topic written by a re-key at topology step `step` (0-based index).
pub fn repartition(application_id: &str, step: usize) -> String {
    format!("{application_id}-{step}-repartition")
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
    pub stores: Vec<String>,
}

/// The sub-topologies of a declarative spec: a `groupBy` at step `i` ends one at the
/// repartition topic `repartition(app, i)` and starts the next one reading it.
pub fn layout(application_id: &str, spec: &crate::AppSpec) -> Vec<SubLayout> {
    use crate::Step;
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
            Step::GroupBy(_) => {
                subs.extend(cur.take());
                cur = Some(SubLayout {
                    source: repartition(application_id, i),
                    internal: true,
                    stores: Vec::new(),
                });
            }
            Step::Count(c) => cur.iter_mut().for_each(|s| s.stores.push(c.store.clone())),
            Step::Aggregate(a) => cur.iter_mut().for_each(|s| s.stores.push(a.store.clone())),
            Step::Filter(_) | Step::Map(_) | Step::To(_) => {}
        }
    }
    subs.extend(cur);
    subs
}

/// An internal topic an app needs.
#[derive(Clone, Debug, PartialEq)]
pub struct InternalTopic {
    pub name: String,
    pub partitions: i32,
    pub config: Vec<(&'static str, &'static str)>,
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
                config: vec![("cleanup.policy", "delete")],
            });
        }
        for store in &sub.stores {
            out.push(InternalTopic {
                name: changelog(application_id, store),
                partitions: n,
                config: vec![("cleanup.policy", "compact")],
            });
        }
        counts.push(n);
        upstream = n;
    }
    if with_dead_letter {
        out.push(InternalTopic {
            name: dead_letter(application_id),
            partitions: 1,
            config: vec![("cleanup.policy", "delete")],
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
}
