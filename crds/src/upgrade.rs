//! What updating an app from one version to the next does to its internal topics. Records
//! in flight in a repartition topic that the new version no longer reads are stranded (never
//! processed), and the state of a store the new version no longer has is dropped. A pure
//! function of the two versions, so `eddy-worker check --previous` can say it before a
//! rolling update, and the operator could too.

use crate::spec::AppSpec;
use crate::step::{Format, GroupBy};
use crate::topics::{self, InternalName, Origin};
use std::fmt;

/// A repartition topic, the index of the groupBy that writes it, and that groupBy.
type Repartition = (String, usize, GroupBy);

/// One version of an app.
#[derive(Clone, Copy, Debug)]
pub struct Version<'a> {
    pub application_id: &'a str,
    pub spec: &'a AppSpec,
}

/// A change between two versions that concerns internal topics.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// Every internal topic is named after the application id, so all of them change.
    ApplicationId { old: String, new: String },
    /// A repartition topic of the old version that the new one neither writes nor reads.
    Stranded {
        topic: String,
        /// The old version's groupBy that wrote it.
        old_step: usize,
        old: GroupBy,
        /// The new version's groupBy that seems to take its place (same key, or the same
        /// rank among the new groupBys), with the topic it writes instead.
        successor: Option<Successor>,
    },
    /// A store of the old version that the new one does not have.
    StoreDropped {
        store: String,
        changelog: String,
        /// Where the old version defines it: `topology[3]`, or `tables.customers`.
        defined: String,
        /// Stores only the new version has, which start empty (a renamed store is one).
        new_stores: Vec<String>,
    },
    /// A table's store both versions have, versioned in one and not the other: the new
    /// version cannot read the old one's state (local or in the changelog).
    StoreLayout {
        table: String,
        store: String,
        /// The new version's table is versioned.
        versioned: bool,
    },
    /// A repartition topic both versions use, written with another key: the records in
    /// flight, keyed the old way, are processed by the new version. Not a loss.
    Rekeyed {
        topic: String,
        old_step: usize,
        old: GroupBy,
        new_step: usize,
        new: GroupBy,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Successor {
    pub step: usize,
    pub group_by: GroupBy,
    pub topic: String,
}

impl Change {
    /// True when the update loses records in flight or state; false for a note.
    pub fn loses_data(&self) -> bool {
        !matches!(self, Change::Rekeyed { .. })
    }

    /// The new version's step, rewritten so that it keeps the old topic: its `name` set to
    /// the old topic's id (the old name, or the old index for an unnamed step).
    pub fn keeping_step(&self) -> Option<(usize, String)> {
        let Change::Stranded {
            old_step,
            old,
            successor: Some(s),
            ..
        } = self
        else {
            return None;
        };
        let id = topics::repartition_id(*old_step, old.name());
        let mut yaml = format!("groupBy: {{key: {}", quoted(s.group_by.expr()));
        if s.group_by.format() != Format::String {
            yaml += &format!(", format: {}", format_name(s.group_by.format()));
        }
        yaml += &format!(", name: {}}}", plain_or_quoted(&id));
        Some((s.step, yaml))
    }
}

/// What changes between `old` and `new` for their internal topics: stranded repartition
/// topics, then notes, then dropped stores, each in topology order.
pub fn compare(old: Version<'_>, new: Version<'_>) -> Vec<Change> {
    if old.application_id != new.application_id {
        return vec![Change::ApplicationId {
            old: old.application_id.to_string(),
            new: new.application_id.to_string(),
        }];
    }
    let before = topics::internal_names(old.application_id, old.spec);
    let after = topics::internal_names(new.application_id, new.spec);
    let repartitions = |names: &[InternalName]| -> Vec<Repartition> {
        names
            .iter()
            .filter_map(|n| match &n.origin {
                Origin::Repartition { step, group_by } => {
                    Some((n.topic.clone(), *step, group_by.clone()))
                }
                _ => None,
            })
            .collect()
    };
    let stores = |names: &[InternalName]| -> Vec<(String, String, String)> {
        names
            .iter()
            .filter_map(|n| match &n.origin {
                Origin::Changelog { step, store, .. } => {
                    Some((store.clone(), format!("topology[{step}]"), n.topic.clone()))
                }
                // A table's store renamed starts empty and its table reads on from the
                // committed offsets: the table's earlier records are missing from it.
                Origin::Table { table, store } => {
                    Some((store.clone(), format!("tables.{table}"), n.topic.clone()))
                }
                _ => None,
            })
            .collect()
    };
    let (old_r, new_r) = (repartitions(&before), repartitions(&after));
    let gone: Vec<&Repartition> = old_r
        .iter()
        .filter(|(t, ..)| !new_r.iter().any(|(n, ..)| n == t))
        .collect();
    let fresh: Vec<&Repartition> = new_r
        .iter()
        .filter(|(t, ..)| !old_r.iter().any(|(o, ..)| o == t))
        .collect();
    let successors = pair(&gone, &fresh);

    let mut changes = Vec::new();
    for (i, (topic, old_step, g)) in gone.iter().enumerate() {
        changes.push(Change::Stranded {
            topic: topic.clone(),
            old_step: *old_step,
            old: g.clone(),
            successor: successors[i].map(|(t, step, g)| Successor {
                step: *step,
                group_by: g.clone(),
                topic: t.clone(),
            }),
        });
    }
    for (topic, old_step, o) in &old_r {
        if let Some((_, new_step, n)) = new_r.iter().find(|(t, ..)| t == topic)
            && (o.expr() != n.expr() || o.format() != n.format())
        {
            changes.push(Change::Rekeyed {
                topic: topic.clone(),
                old_step: *old_step,
                old: o.clone(),
                new_step: *new_step,
                new: n.clone(),
            });
        }
    }
    let (old_s, new_s) = (stores(&before), stores(&after));
    let new_stores: Vec<String> = new_s
        .iter()
        .filter(|(s, ..)| !old_s.iter().any(|(o, ..)| o == s))
        .map(|(s, ..)| s.clone())
        .collect();
    for (store, defined, changelog) in &old_s {
        if !new_s.iter().any(|(s, ..)| s == store) {
            changes.push(Change::StoreDropped {
                store: store.clone(),
                changelog: changelog.clone(),
                defined: defined.clone(),
                new_stores: new_stores.clone(),
            });
        }
    }
    for (table, t) in &new.spec.tables {
        let Some(o) = old.spec.tables.get(table) else {
            continue;
        };
        let store = t.store_name(table);
        if o.store_name(table) == store && o.versioned.is_some() != t.versioned.is_some() {
            changes.push(Change::StoreLayout {
                table: table.clone(),
                store: store.to_string(),
                versioned: t.versioned.is_some(),
            });
        }
    }
    changes
}

/// For each stranded old groupBy, the new one that takes its place: first one with the same
/// key and format; the others by rank, when as many are left on both sides.
fn pair<'a>(gone: &[&Repartition], fresh: &[&'a Repartition]) -> Vec<Option<&'a Repartition>> {
    let mut taken = vec![false; fresh.len()];
    let mut out = Vec::with_capacity(gone.len());
    for (_, _, g) in gone {
        let same = (0..fresh.len()).find(|&i| {
            let n = &fresh[i].2;
            !taken[i] && n.expr() == g.expr() && n.format() == g.format()
        });
        if let Some(i) = same {
            taken[i] = true;
        }
        out.push(same.map(|i| fresh[i]));
    }
    let left: Vec<usize> = (0..fresh.len()).filter(|&i| !taken[i]).collect();
    if left.len() == out.iter().filter(|o| o.is_none()).count() {
        let mut left = left.into_iter();
        for o in out.iter_mut().filter(|o| o.is_none()) {
            *o = left.next().map(|i| fresh[i]);
        }
    }
    out
}

/// A YAML single-quoted scalar: jq expressions are full of `{`, `:`, `"` and `,`.
fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// `by-user` as it is, `'1'` quoted: a name YAML would read as a number (or a boolean, or
/// null) must be quoted to stay a string.
fn plain_or_quoted(s: &str) -> String {
    let plain = matches!(
        serde_yaml::from_str::<serde_yaml::Value>(&format!("{{name: {s}}}")),
        Ok(v) if v.get("name").and_then(|v| v.as_str()) == Some(s)
    );
    if plain { s.to_string() } else { quoted(s) }
}

fn format_name(f: Format) -> String {
    serde_yaml::to_string(&f)
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| format!("{f:?}").to_lowercase())
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::ApplicationId { old, new } => write!(
                f,
                "applicationId changes from {old} to {new}: every internal topic is named after it, so records in flight in {old}'s repartition topics are stranded and every store starts empty (its state is in {old}'s changelogs). To keep them, keep `applicationId: {old}`."
            ),
            Change::Stranded {
                topic,
                old_step,
                old,
                successor,
            } => {
                write!(
                    f,
                    "repartition topic {topic} (written by the old topology[{old_step}] groupBy {}) is no longer used",
                    quoted(old.expr())
                )?;
                match successor {
                    Some(s) => write!(
                        f,
                        ": the new topology[{}] groupBy writes {} instead",
                        s.step, s.topic
                    )?,
                    None => f.write_str(": the new version has no groupBy to take it over")?,
                }
                write!(
                    f,
                    ". Records in flight in {topic} when the update rolls out would be stranded: never processed, missing from every result downstream."
                )?;
                match self.keeping_step() {
                    Some((step, yaml)) => write!(
                        f,
                        "\n  To keep the topic, name the step after it, as topology[{step}]:\n    - {yaml}"
                    ),
                    None => write!(
                        f,
                        "\n  To lose nothing, let the old version drain it first: stop its input and wait until eddy_consumer_lag_records{{topic=\"{topic}\"}} is 0, then update (and delete {topic})."
                    ),
                }
            }
            Change::StoreLayout {
                table,
                store,
                versioned,
            } => write!(
                f,
                "table {table} {} versioned: its store {store} keeps {} under the same name, and the new version cannot read the old state (neither on disk nor in the changelog): the table would lose the keys not updated since. Keep versioned as it was, or reset the application (delete its state directories, its internal topics and its consumer group's offsets) so that the table is read again from its topic.",
                if *versioned {
                    "becomes"
                } else {
                    "is no longer"
                },
                if *versioned {
                    "versions instead of latest values"
                } else {
                    "latest values instead of versions"
                }
            ),
            Change::StoreDropped {
                store,
                changelog,
                defined,
                new_stores,
            } => {
                write!(
                    f,
                    "store {store} (old {defined}) is not in the new version: its state is dropped, and its changelog {changelog} is no longer used."
                )?;
                if !new_stores.is_empty() {
                    write!(
                        f,
                        " The new store(s) {} start empty: a renamed store does not take over the old one's state.",
                        new_stores.join(", ")
                    )?;
                }
                write!(f, "\n  To keep the state, keep a store named {store}.")
            }
            Change::Rekeyed {
                topic,
                old_step,
                old,
                new_step,
                new,
            } => write!(
                f,
                "repartition topic {topic} is written by groupBy {} (topology[{new_step}]) instead of {} (old topology[{old_step}]): records in flight there, keyed the old way, are processed by the new version.",
                quoted(new.expr()),
                quoted(old.expr())
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::step::Step;

    fn spec(steps: &str) -> AppSpec {
        crate::parse_app(&format!("topology:\n{steps}"))
            .expect("valid")
            .spec
    }

    /// A step as a user pastes it into the topology.
    fn pasted(yaml: &str) -> Step {
        serde_yaml::with::singleton_map_recursive::deserialize(serde_yaml::Deserializer::from_str(
            yaml,
        ))
        .expect("the suggestion is valid YAML")
    }

    fn changes(old: &AppSpec, new: &AppSpec) -> Vec<Change> {
        let v = |spec| Version {
            application_id: "pv",
            spec,
        };
        compare(v(old), v(new))
    }

    const V1: &str =
        "- from: {topic: in}\n- groupBy: '.user'\n- count: {store: views}\n- to: {topic: out}\n";
    const V2: &str = "- from: {topic: in}\n- filter: '.ok'\n- groupBy: '.user'\n- count: {store: views}\n- to: {topic: out}\n";

    #[test]
    fn an_inserted_step_strands_an_unnamed_groupby_and_its_name_keeps_the_topic() {
        let (old, mut new) = (spec(V1), spec(V2));
        let c = changes(&old, &new);
        assert_eq!(c.len(), 1, "{c:?}");
        assert!(c[0].loses_data());
        let Change::Stranded {
            topic,
            old_step,
            successor: Some(s),
            ..
        } = &c[0]
        else {
            panic!("expected a stranded topic with a successor, got {c:?}");
        };
        assert_eq!((topic.as_str(), *old_step), ("pv-1-repartition", 1));
        assert_eq!((s.step, s.topic.as_str()), (2, "pv-2-repartition"));
        let (step, yaml) = c[0].keeping_step().expect("a step to keep the topic");
        assert_eq!(step, 2);
        assert_eq!(yaml, "groupBy: {key: '.user', name: '1'}");
        let text = c[0].to_string();
        assert!(
            text.contains("pv-1-repartition") && text.contains("stranded") && text.contains(&yaml),
            "{text}"
        );

        // The suggested step, pasted in, keeps the old topic: nothing is stranded any more.
        new.topology[2] = pasted(&yaml);
        crate::manifest::validate(&new, "").expect("the suggestion is a valid step");
        assert_eq!(changes(&old, &new), []);
    }

    #[test]
    fn a_table_made_versioned_or_not_cannot_read_its_old_state() {
        let app = |extra: &str| {
            crate::parse_app(&format!(
                "tables:\n  c: {{topic: cust{extra}}}\ntopology:\n- from: {{topic: in}}\n- join: {{table: c, as: '.'}}\n"
            ))
            .expect("valid")
            .spec
        };
        let (plain, versioned) = (app(""), app(", versioned: {history: 1h}"));
        let c = changes(&plain, &versioned);
        assert_eq!(
            c,
            [Change::StoreLayout {
                table: "c".into(),
                store: "c".into(),
                versioned: true
            }]
        );
        assert!(c[0].loses_data());
        assert!(
            c[0].to_string().contains("reset the application"),
            "{}",
            c[0]
        );
        assert_eq!(changes(&versioned, &plain).len(), 1);
        assert_eq!(changes(&versioned, &versioned), []);
    }

    #[test]
    fn a_named_groupby_keeps_its_topic_whatever_is_inserted() {
        let named = |steps: &str| spec(&steps.replace("'.user'", "{key: '.user', name: by-user}"));
        assert_eq!(changes(&named(V1), &named(V2)), []);
        assert_eq!(changes(&named(V2), &named(V1)), []);
        // A name dropped in the new version: the suggestion puts it back.
        let c = changes(&named(V1), &spec(V2));
        let (_, yaml) = c[0].keeping_step().expect("a step");
        assert_eq!(yaml, "groupBy: {key: '.user', name: by-user}");
    }

    #[test]
    fn keys_and_formats_are_kept_in_the_suggestion() {
        let old = spec("- from: {topic: in}\n- groupBy: {key: '.a + \"x\"', format: json}\n");
        let new =
            spec("- from: {topic: in}\n- map: '.'\n- groupBy: {key: '.a + \"x\"', format: json}\n");
        let c = changes(&old, &new);
        let (_, yaml) = c[0].keeping_step().expect("a step");
        assert_eq!(
            yaml,
            "groupBy: {key: '.a + \"x\"', format: json, name: '1'}"
        );
        let quote = spec("- from: {topic: in}\n- groupBy: \".a == 'b'\"\n");
        let quote2 = spec("- from: {topic: in}\n- filter: '.'\n- groupBy: \".a == 'b'\"\n");
        let (_, yaml) = changes(&quote, &quote2)[0].keeping_step().expect("a step");
        match pasted(&yaml) {
            Step::GroupBy(g) => assert_eq!((g.expr(), g.name()), (".a == 'b'", Some("1"))),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_removed_groupby_says_to_drain_and_a_removed_store_is_dropped_state() {
        let old = spec(V1);
        let new = spec("- from: {topic: in}\n- count: {store: total}\n");
        let c = changes(&old, &new);
        assert_eq!(c.len(), 2, "{c:?}");
        assert!(matches!(
            &c[0],
            Change::Stranded {
                successor: None,
                ..
            }
        ));
        assert_eq!(c[0].keeping_step(), None);
        assert!(c[0].to_string().contains("drain"), "{}", c[0]);
        assert!(
            matches!(&c[1], Change::StoreDropped { store, changelog, .. }
            if store == "views" && changelog == "pv-views-changelog")
        );
        let text = c[1].to_string();
        assert!(
            text.contains("state is dropped") && text.contains("total start empty"),
            "{text}"
        );
        assert!(c.iter().all(Change::loses_data));
    }

    #[test]
    fn two_new_groupbys_are_paired_by_key_then_by_rank() {
        let old = spec(
            "- from: {topic: in}\n- groupBy: '.a'\n- count: {store: x}\n- groupBy: '.b'\n- count: {store: y}\n",
        );
        let new = spec(
            "- from: {topic: in}\n- filter: '.'\n- groupBy: '.a2'\n- count: {store: x}\n- groupBy: '.b'\n- count: {store: y}\n",
        );
        let c = changes(&old, &new);
        let steps: Vec<(usize, usize)> = c
            .iter()
            .filter_map(|c| match c {
                Change::Stranded {
                    old_step,
                    successor: Some(s),
                    ..
                } => Some((*old_step, s.step)),
                _ => None,
            })
            .collect();
        assert_eq!(steps, [(1, 2), (3, 4)], "{c:?}");
    }

    /// A table's store renamed would start empty while its table reads on from the
    /// committed offsets: check says so.
    #[test]
    fn a_renamed_table_store_is_dropped_state() {
        let app = |store: &str| {
            crate::parse_app(&format!("tables:\n  c: {{topic: customers, store: {store}}}\ntopology:\n- from: {{topic: orders}}\n- join: {{table: c, as: '.'}}\n"))
                .expect("valid")
                .spec
        };
        let (old, new) = (app("c1"), app("c2"));
        let c = changes(&old, &new);
        assert!(matches!(&c[..], [Change::StoreDropped { .. }]), "{c:?}");
        assert!(c[0].loses_data());
        let text = c[0].to_string();
        assert!(
            text.contains("store c1 (old tables.c) is not in the new version")
                && text.contains("The new store(s) c2 start empty"),
            "{text}"
        );
    }

    #[test]
    fn a_changed_key_on_a_kept_topic_is_a_note() {
        let old = spec(V1);
        let new = spec(&V1.replace("'.user'", "'.user | ascii_downcase'"));
        let c = changes(&old, &new);
        assert!(matches!(&c[..], [Change::Rekeyed { .. }]), "{c:?}");
        assert!(!c[0].loses_data());
    }

    #[test]
    fn a_new_application_id_renames_everything() {
        let s = spec(V1);
        let c = compare(
            Version {
                application_id: "pv",
                spec: &s,
            },
            Version {
                application_id: "ns-pv",
                spec: &s,
            },
        );
        assert!(matches!(&c[..], [Change::ApplicationId { .. }]), "{c:?}");
        assert!(c[0].loses_data());
        assert!(c[0].to_string().contains("applicationId: pv"), "{}", c[0]);
    }
}
