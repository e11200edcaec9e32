//! The operator's decision, as a pure function: from the app's spec, what the cluster shows
//! and what Kafka says, to the objects that should exist, the internal topics to create and
//! the status to write. No I/O here: `controller.rs` gathers the inputs and applies the result.

use crate::assignment;
use crate::resources::{self, Objects};
use eddy_crds::resource::{AppStatus, Condition, Phase, StatefulStreamApp};
use eddy_crds::topics::{self, InternalTopic};
use std::collections::HashMap;

/// What Kafka told the operator.
#[derive(Clone, Debug, PartialEq)]
pub enum KafkaFacts {
    /// Partition counts of the topics that exist.
    Topics(HashMap<String, i32>),
    Unreachable(String),
    /// A Secret (or a key of it) that `spec.kafka.tls`/`sasl` names is missing.
    CredentialsMissing(String),
}

/// What the cluster shows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    /// `status.readyReplicas` of the worker StatefulSet, if it exists.
    pub ready_replicas: Option<i32>,
}

/// A Kubernetes Event to record.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub warning: bool,
    pub reason: String,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Desired {
    /// None when the spec cannot be turned into objects (the status says why).
    pub objects: Option<Objects>,
    pub topics: Vec<InternalTopic>,
    pub status: AppStatus,
    pub events: Vec<Event>,
}

/// Decide. `now` is an RFC 3339 timestamp for condition transitions.
pub fn reconcile(
    app: &StatefulStreamApp,
    observed: &Observed,
    kafka: &KafkaFacts,
    now: &str,
) -> Desired {
    let name = resources::name(app);
    let prev = app.status.clone().unwrap_or_default();
    let replicas = app.spec.replicas.unwrap_or(1);
    let application_id = app
        .spec
        .application_id
        .clone()
        .unwrap_or_else(|| name.clone());
    let mut status = AppStatus {
        observed_generation: app.metadata.generation,
        replicas,
        ready_replicas: observed.ready_replicas.unwrap_or(0),
        ready: Some(format!(
            "{}/{replicas}",
            observed.ready_replicas.unwrap_or(0)
        )),
        selector: Some(resources::selector_string(app)),
        assignment: prev.assignment.clone(),
        workers: prev.workers.clone(),
        ..Default::default()
    };
    let mut events = Vec::new();

    // Problems that leave the app Degraded, first one wins.
    let mut problem: Option<(&str, String)> = None;
    if let Err(e) = eddy_crds::manifest::validate(&app.spec, "spec.") {
        problem = Some(("InvalidSpec", e.to_string()));
    }
    let spec_hash = hash(&app.spec);
    let objects = match resources::build(app, &spec_hash) {
        Ok(o) => Some(o),
        Err(e) => {
            problem.get_or_insert(("InvalidSpec", e));
            None
        }
    };

    let mut topics_to_create = Vec::new();
    if problem.is_none() {
        match kafka {
            KafkaFacts::Unreachable(e) => problem = Some(("KafkaUnreachable", e.clone())),
            KafkaFacts::CredentialsMissing(e) => {
                problem = Some(("KafkaCredentialsMissing", e.clone()))
            }
            KafkaFacts::Topics(existing) => {
                let layout = topics::layout(&application_id, &app.spec);
                let dead_letter = app.spec.on_error == eddy_crds::OnError::DeadLetter;
                match topics::plan(&application_id, &layout, dead_letter, |t| {
                    existing.get(t).copied()
                }) {
                    Err(missing) => {
                        problem = Some((
                            "SourceTopicMissing",
                            format!(
                                "source topic {missing:?} does not exist: create it, the app starts once it does"
                            ),
                        ))
                    }
                    Ok((internal, partitions)) => {
                        for t in &internal {
                            match existing.get(&t.name) {
                                Some(&n) if n != t.partitions => {
                                    problem.get_or_insert((
                                        "InternalTopicMismatch",
                                        format!(
                                            "internal topic {:?} has {n} partitions, the app needs {}: delete it (its state will be rebuilt)",
                                            t.name, t.partitions
                                        ),
                                    ));
                                }
                                Some(_) => {}
                                None => topics_to_create.push(t.clone()),
                            }
                        }
                        let pods: Vec<String> =
                            (0..replicas).map(|i| format!("{name}-{i}")).collect();
                        status.assignment = Some(assignment::assign(
                            &partitions,
                            &pods,
                            prev.assignment.as_ref(),
                        ));
                    }
                }
            }
        }
    }

    // Workers report only for pods that exist in the current placement.
    status.workers.retain(|pod, _| {
        status
            .assignment
            .as_ref()
            .is_some_and(|a| a.pods.contains_key(pod))
    });
    status.backlog = status
        .workers
        .values()
        .flat_map(|w| w.tasks.values())
        .map(|t| t.restore_backlog)
        .sum();

    let generation = status.assignment.as_ref().map_or(0, |a| a.generation);
    let all_applied = status.assignment.as_ref().is_some_and(|a| {
        a.pods.keys().all(|pod| {
            status
                .workers
                .get(pod)
                .is_some_and(|w| w.applied_generation == generation)
        })
    });
    let all_running = status.assignment.as_ref().is_some_and(|a| {
        a.pods.iter().all(|(pod, t)| {
            status.workers.get(pod).is_some_and(|w| {
                t.active
                    .iter()
                    .all(|id| w.tasks.get(id).is_some_and(|s| s.state == "RUNNING"))
            })
        })
    });
    let restoring = status
        .workers
        .values()
        .flat_map(|w| w.tasks.values())
        .any(|t| t.state == "RESTORING");

    let (phase, ready, progressing) = match &problem {
        Some(_) => (Phase::Degraded, false, false),
        None if all_applied && all_running && status.ready_replicas >= replicas => {
            (Phase::Running, true, false)
        }
        None if restoring || status.backlog > 0 => (Phase::Restoring, false, true),
        None => (Phase::Pending, false, true),
    };
    status.phase = Some(phase);
    let (p_reason, p_message) = match phase {
        Phase::Restoring => (
            "Restoring",
            format!("{} changelog records left to restore", status.backlog),
        ),
        Phase::Pending => (
            "WaitingForWorkers",
            format!(
                "{}/{replicas} workers ready, waiting for every task to run",
                status.ready_replicas
            ),
        ),
        _ => ("Stable", "every task runs where it is assigned".to_string()),
    };
    let (d_status, d_reason, d_message) = match &problem {
        Some((reason, message)) => ("True", reason.to_string(), message.clone()),
        None => (
            "False",
            "Healthy".to_string(),
            "no problem found".to_string(),
        ),
    };
    status.conditions = vec![
        condition(
            &prev,
            "Ready",
            ready,
            if ready { "Running" } else { "NotReady" },
            &format!("phase {phase:?}"),
            app,
            now,
        ),
        condition(
            &prev,
            "Progressing",
            progressing,
            p_reason,
            &p_message,
            app,
            now,
        ),
        condition(
            &prev,
            "Degraded",
            d_status == "True",
            &d_reason,
            &d_message,
            app,
            now,
        ),
    ];
    if let Some((reason, message)) = &problem {
        // Only when the problem is new, so a stuck app does not flood the event stream.
        let was = prev
            .conditions
            .iter()
            .any(|c| c.type_ == "Degraded" && c.reason == *reason && c.message == *message);
        if !was {
            events.push(Event {
                warning: true,
                reason: reason.to_string(),
                message: message.clone(),
            });
        }
    }
    Desired {
        objects,
        topics: topics_to_create,
        status,
        events,
    }
}

fn condition(
    prev: &AppStatus,
    type_: &str,
    on: bool,
    reason: &str,
    message: &str,
    app: &StatefulStreamApp,
    now: &str,
) -> Condition {
    let status = if on { "True" } else { "False" };
    // The transition time moves only when the status flips.
    let since = prev
        .conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.to_string());
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: Some(since),
        observed_generation: app.metadata.generation,
    }
}

/// A stable hash of the spec (FNV-1a of its JSON) but the replica count, to roll the pods
/// when what they run changes.
fn hash(spec: &eddy_crds::AppSpec) -> String {
    let mut spec = spec.clone();
    spec.replicas = None;
    let bytes = serde_json::to_vec(&spec).unwrap_or_default();
    let h = bytes.iter().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100000001b3)
    });
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use eddy_crds::resource::{TaskStatus, WorkerStatus};

    fn app(yaml: &str) -> StatefulStreamApp {
        let mut a: StatefulStreamApp = serde_yaml::from_str(yaml).expect("valid app");
        a.metadata.namespace = Some("ns".into());
        a.metadata.uid = Some("uid-1".into());
        a.metadata.generation = Some(3);
        a
    }

    const PV: &str = "apiVersion: eddy.dev/v1alpha1\nkind: StatefulStreamApp\nmetadata: {name: pv}\nspec:\n  replicas: 2\n  topology:\n    - from: {topic: views}\n    - groupBy: '.user'\n    - count: {store: c}\n    - to: {topic: out}\n";

    fn kafka(pairs: &[(&str, i32)]) -> KafkaFacts {
        KafkaFacts::Topics(pairs.iter().map(|(t, n)| (t.to_string(), *n)).collect())
    }

    #[test]
    fn a_new_app_gets_its_objects_topics_and_a_balanced_assignment() {
        let d = reconcile(
            &app(PV),
            &Observed::default(),
            &kafka(&[("views", 4), ("out", 4)]),
            "t0",
        );
        let o = d.objects.expect("objects");
        let sts = o.stateful_set.spec;
        assert_eq!(sts.replicas, Some(2));
        assert_eq!(sts.service_name.as_deref(), Some("pv-workers"));
        assert_eq!(
            o.stateful_set
                .metadata
                .owner_references
                .map(|o| o[0].uid.clone()),
            Some("uid-1".into())
        );
        let names: Vec<&str> = d.topics.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["pv-1-repartition", "pv-c-changelog"]);
        let a = d.status.assignment.expect("assignment");
        assert_eq!(a.partitions, [4, 4]);
        assert_eq!(a.pods["pv-0"].active.len(), 4);
        assert_eq!(a.pods["pv-1"].active.len(), 4);
        assert_eq!(d.status.phase, Some(Phase::Pending));
        assert_eq!(d.status.ready.as_deref(), Some("0/2"));
        assert_eq!(d.status.observed_generation, Some(3));
    }

    #[test]
    fn existing_internal_topics_are_not_created_again() {
        let facts = kafka(&[("views", 4), ("pv-1-repartition", 4), ("pv-c-changelog", 4)]);
        let d = reconcile(&app(PV), &Observed::default(), &facts, "t0");
        assert!(d.topics.is_empty());
    }

    #[test]
    fn unreachable_kafka_and_missing_source_are_degraded_with_an_event_once() {
        let d = reconcile(
            &app(PV),
            &Observed::default(),
            &KafkaFacts::Unreachable("connection refused".into()),
            "t0",
        );
        assert_eq!(d.status.phase, Some(Phase::Degraded));
        let deg = d
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == "Degraded")
            .expect("condition");
        assert_eq!(
            (deg.status.as_str(), deg.reason.as_str()),
            ("True", "KafkaUnreachable")
        );
        assert_eq!(d.events.len(), 1);
        assert!(d.objects.is_some(), "objects are kept so workers can wait");

        let mut again = app(PV);
        again.status = Some(d.status);
        let d2 = reconcile(
            &again,
            &Observed::default(),
            &KafkaFacts::Unreachable("connection refused".into()),
            "t1",
        );
        assert!(d2.events.is_empty(), "no new event for the same problem");
        let deg = d2
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == "Degraded")
            .expect("condition");
        assert_eq!(deg.last_transition_time.as_deref(), Some("t0"));

        let d = reconcile(&app(PV), &Observed::default(), &kafka(&[("out", 1)]), "t0");
        let deg = d
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == "Degraded")
            .expect("condition");
        assert_eq!(deg.reason, "SourceTopicMissing");
        assert!(deg.message.contains("\"views\""), "{}", deg.message);
    }

    #[test]
    fn wrong_partition_count_of_an_internal_topic_is_degraded() {
        let d = reconcile(
            &app(PV),
            &Observed::default(),
            &kafka(&[("views", 4), ("pv-c-changelog", 2)]),
            "t0",
        );
        let deg = d
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == "Degraded")
            .expect("condition");
        assert_eq!(deg.reason, "InternalTopicMismatch");
    }

    #[test]
    fn invalid_spec_is_degraded_and_creates_no_topics() {
        let bad = app(
            "apiVersion: eddy.dev/v1alpha1\nkind: StatefulStreamApp\nmetadata: {name: pv}\nspec:\n  replicas: 2\n  numStandbyReplicas: 5\n  topology:\n    - from: {topic: views}\n",
        );
        let d = reconcile(&bad, &Observed::default(), &kafka(&[("views", 4)]), "t0");
        let deg = d
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == "Degraded")
            .expect("condition");
        assert_eq!(deg.reason, "InvalidSpec");
        assert!(deg.message.contains("numStandbyReplicas"));
        assert!(d.topics.is_empty());
    }

    fn report(d: &Desired, state: &str, backlog: i64) -> AppStatus {
        let mut s = d.status.clone();
        let a = s.assignment.clone().expect("assignment");
        for (pod, t) in &a.pods {
            s.workers.insert(
                pod.clone(),
                WorkerStatus {
                    applied_generation: a.generation,
                    tasks: t
                        .active
                        .iter()
                        .map(|id| {
                            (
                                id.clone(),
                                TaskStatus {
                                    state: state.into(),
                                    restore_backlog: backlog,
                                    lag: None,
                                },
                            )
                        })
                        .collect(),
                    updated: None,
                    problem: None,
                },
            );
        }
        s
    }

    #[test]
    fn phase_follows_the_workers_reports() {
        let facts = kafka(&[("views", 2), ("out", 2)]);
        let first = reconcile(&app(PV), &Observed::default(), &facts, "t0");

        let mut restoring = app(PV);
        restoring.status = Some(report(&first, "RESTORING", 10));
        let d = reconcile(
            &restoring,
            &Observed {
                ready_replicas: Some(0),
            },
            &facts,
            "t1",
        );
        assert_eq!(d.status.phase, Some(Phase::Restoring));
        assert_eq!(d.status.backlog, 40, "4 tasks x 10 records");

        let mut running = app(PV);
        running.status = Some(report(&first, "RUNNING", 0));
        let d = reconcile(
            &running,
            &Observed {
                ready_replicas: Some(2),
            },
            &facts,
            "t2",
        );
        assert_eq!(d.status.phase, Some(Phase::Running));
        let ready = d
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .expect("condition");
        assert_eq!(ready.status, "True");
        assert_eq!(d.status.ready.as_deref(), Some("2/2"));
    }

    #[test]
    fn scaling_keeps_tasks_sticky_and_drops_reports_of_removed_pods() {
        let facts = kafka(&[("views", 6), ("out", 6)]);
        let first = reconcile(&app(PV), &Observed::default(), &facts, "t0");
        let mut scaled = app(&PV.replace("replicas: 2", "replicas: 3"));
        scaled.status = Some(report(&first, "RUNNING", 0));
        let d = reconcile(&scaled, &Observed::default(), &facts, "t1");
        let a = d.status.assignment.expect("assignment");
        assert_eq!(a.pods.len(), 3);
        assert_eq!(a.generation, 2);
        let mut smaller = app(&PV.replace("replicas: 2", "replicas: 1"));
        smaller.status = Some(report(&first, "RUNNING", 0));
        let d = reconcile(&smaller, &Observed::default(), &facts, "t1");
        assert!(!d.status.workers.contains_key("pv-1"));
    }

    #[test]
    fn a_spec_change_changes_the_pod_template_hash() {
        let facts = kafka(&[("views", 2)]);
        let hash_of = |d: &Desired| {
            d.objects.as_ref().and_then(|o| {
                o.stateful_set
                    .spec
                    .template
                    .metadata
                    .as_ref()?
                    .annotations
                    .as_ref()?
                    .get("eddy.dev/spec-hash")
                    .cloned()
            })
        };
        let a = reconcile(&app(PV), &Observed::default(), &facts, "t0");
        let b = reconcile(
            &app(&PV.replace("{topic: out}", "{topic: out2}")),
            &Observed::default(),
            &facts,
            "t0",
        );
        let c = reconcile(
            &app(&PV.replace("replicas: 2", "replicas: 5")),
            &Observed::default(),
            &facts,
            "t0",
        );
        assert_ne!(hash_of(&a), hash_of(&b));
        assert_ne!(hash_of(&a), None);
        assert_eq!(
            hash_of(&a),
            hash_of(&c),
            "scaling changes the count, it does not roll the pods"
        );
    }

    #[test]
    fn pod_template_override_is_merged() {
        let with = app(&PV.replace(
            "replicas: 2\n",
            "replicas: 2\n  podTemplate: {metadata: {labels: {team: a}}, spec: {nodeSelector: {disk: ssd}}}\n",
        ));
        let d = reconcile(&with, &Observed::default(), &kafka(&[("views", 2)]), "t0");
        let t = d.objects.expect("objects").stateful_set.spec.template;
        assert_eq!(
            t.metadata
                .and_then(|m| m.labels)
                .and_then(|l| l.get("team").cloned()),
            Some("a".into())
        );
        let pod = t.spec.expect("pod spec");
        assert_eq!(
            pod.node_selector.and_then(|n| n.get("disk").cloned()),
            Some("ssd".into())
        );
        assert_eq!(pod.containers.len(), 1, "merge keeps the worker container");
    }

    #[test]
    fn kafka_tls_and_sasl_come_from_secrets_not_the_config_map() {
        let with = app(&PV.replace(
            "replicas: 2\n",
            "replicas: 2\n  kafka:\n    tls: {ca: {name: kafka-ca, key: ca.crt}}\n    sasl: {mechanism: SCRAM-SHA-512, username: {name: creds, key: user}, password: {name: creds, key: pass}}\n",
        ));
        let d = reconcile(&with, &Observed::default(), &kafka(&[("views", 2)]), "t0");
        let o = d.objects.expect("objects");
        let pod = o.stateful_set.spec.template.spec.expect("pod spec");
        let c = &pod.containers[0];
        let env: std::collections::BTreeMap<String, String> = c
            .env
            .iter()
            .flatten()
            .map(|e| {
                let from = e
                    .value_from
                    .as_ref()
                    .and_then(|f| f.secret_key_ref.as_ref())
                    .map(|s| format!("secret:{}/{}", s.name, s.key));
                (e.name.clone(), e.value.clone().or(from).unwrap_or_default())
            })
            .collect();
        assert_eq!(env["EDDY_KAFKA_CA_FILE"], "/etc/eddy/kafka/ca/ca.crt");
        assert_eq!(env["EDDY_KAFKA_SASL_USERNAME"], "secret:creds/user");
        assert_eq!(env["EDDY_KAFKA_SASL_PASSWORD"], "secret:creds/pass");
        assert_eq!(env["EDDY_KAFKA_SASL_MECHANISM"], "SCRAM-SHA-512");
        assert_eq!(env["EDDY_KAFKA_SECURITY_PROTOCOL"], "sasl_ssl");
        let vol = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == "kafka-ca")
            .expect("CA volume");
        assert_eq!(
            vol.secret.as_ref().and_then(|s| s.secret_name.clone()),
            Some("kafka-ca".into())
        );
        assert!(
            c.volume_mounts
                .iter()
                .flatten()
                .any(|m| m.mount_path == "/etc/eddy/kafka/ca")
        );
    }

    #[test]
    fn a_literal_sasl_username_is_plain_environment_the_password_a_secret_ref() {
        let with = app(&PV.replace(
            "replicas: 2\n",
            "replicas: 2\n  kafka:\n    sasl: {mechanism: PLAIN, username: alice, password: {secretKeyRef: {name: creds, key: pass}}}\n",
        ));
        let d = reconcile(&with, &Observed::default(), &kafka(&[("views", 2)]), "t0");
        let pod = d
            .objects
            .expect("objects")
            .stateful_set
            .spec
            .template
            .spec
            .expect("pod spec");
        let env = |name: &str| {
            pod.containers[0]
                .env
                .iter()
                .flatten()
                .find(|e| e.name == name)
                .cloned()
                .expect("env var")
        };
        assert_eq!(
            env("EDDY_KAFKA_SASL_USERNAME").value.as_deref(),
            Some("alice")
        );
        let password = env("EDDY_KAFKA_SASL_PASSWORD");
        assert_eq!(password.value, None);
        let r = password
            .value_from
            .and_then(|f| f.secret_key_ref)
            .expect("secretKeyRef");
        assert_eq!((r.name.as_str(), r.key.as_str()), ("creds", "pass"));
        assert_eq!(
            env("EDDY_KAFKA_SECURITY_PROTOCOL").value.as_deref(),
            Some("sasl_plaintext")
        );
        assert!(
            pod.volumes.iter().flatten().all(|v| v.secret.is_none()),
            "SASL alone mounts nothing"
        );
    }

    #[test]
    fn missing_kafka_credentials_are_degraded_with_the_message() {
        let d = reconcile(
            &app(PV),
            &Observed::default(),
            &KafkaFacts::CredentialsMissing(
                "spec.kafka.sasl.password: secret ns/creds not found".into(),
            ),
            "t0",
        );
        assert_eq!(d.status.phase, Some(Phase::Degraded));
        let deg = d
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == "Degraded")
            .expect("condition");
        assert_eq!(deg.reason, "KafkaCredentialsMissing");
        assert!(deg.message.contains("ns/creds"), "{}", deg.message);
        assert!(d.topics.is_empty() && d.status.assignment.is_none());
        assert_eq!(d.events.len(), 1);
    }

    #[test]
    fn worker_role_only_reads_its_app_and_patches_its_status() {
        let d = reconcile(
            &app(PV),
            &Observed::default(),
            &kafka(&[("views", 2)]),
            "t0",
        );
        let rules = d.objects.expect("objects").role.rules.expect("rules");
        for r in &rules {
            assert_eq!(r.resource_names.as_deref(), Some(&["pv".to_string()][..]));
            assert!(
                !r.verbs
                    .iter()
                    .any(|v| v == "delete" || v == "update" || v == "create")
            );
        }
        assert!(rules.iter().any(|r| r.resources.as_deref()
            == Some(&["statefulstreamapps/status".to_string()][..])
            && r.verbs.contains(&"patch".to_string())));
    }
}
