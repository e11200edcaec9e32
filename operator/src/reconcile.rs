//! The operator's decision, as a pure function: from the app's spec, what the cluster shows
//! and what Kafka says, to the objects that should exist, the internal topics to create and
//! the status to write. No I/O here: `controller.rs` gathers the inputs and applies the result.
//! What stops an app is a list of [`problems::Problem`]s; they make the `Degraded` condition.

pub mod gate;
pub mod problems;

use crate::app::AppClaim;
use crate::placement::{self, Health, PodObserved};
use crate::resources::{self, Kind, Objects};
use crate::rollout;
use eddy_crds::resource::{AppStatus, Condition, Phase, StatefulStreamApp, TaskState};
use eddy_crds::spec::ProcessingGuarantee;
use eddy_crds::topics::{self, InternalTopic};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
pub use problems::{Problem, Reason};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// What Kafka told the operator.
#[derive(Clone, Debug, PartialEq)]
pub enum KafkaFacts {
    /// Partition counts of the topics that exist.
    Topics(HashMap<String, i32>),
    Unreachable(String),
    /// A Secret (or a key of it) that `spec.kafka.tls`/`sasl` names is missing.
    CredentialsMissing(String),
    /// A Secret that `spec.kafka.tls`/`sasl` names may not be this app's credential.
    CredentialsNotAllowed(String),
}

/// What the cluster shows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    /// `status.readyReplicas` of the app's own worker StatefulSet, if it exists.
    pub ready_replicas: Option<i32>,
    /// Objects with the names this app needs that are not this app's.
    pub foreign: Vec<Foreign>,
    /// The application ids of every app (this one may be among them).
    pub claims: Vec<AppClaim>,
    /// The app's worker pods by name (a pod without a Pod object is absent). None: not
    /// observed, every pod counts as up.
    pub pods: Option<BTreeMap<String, PodObserved>>,
    /// The app's own worker StatefulSet, if it exists.
    pub stateful_set: Option<OwnStatefulSet>,
    /// Per pod with a report: seconds since the operator first saw its current report, on
    /// the operator's own clock ([`crate::report_clock`]); a pod missing here counts as just
    /// seen.
    pub report_ages: BTreeMap<String, u64>,
    /// The pod template revision each observed pod runs (`controller-revision-hash`).
    pub revisions: BTreeMap<String, String>,
    /// A digest of the Kafka credentials the app's Secrets hold
    /// ([`crate::kafka::Connection::digest`]); None when it names none.
    pub credentials_digest: Option<String>,
    /// The spec the workers run: the app file in the app's own ConfigMap ([`gate`]).
    pub running: Option<eddy_crds::AppSpec>,
}

/// Pod template annotation: [`Observed::credentials_digest`], so a rotated Secret rolls the
/// pods (the workers read their credentials when they start).
pub const CREDENTIALS_DIGEST: &str = "eddy.dev/credentials-digest";

/// What the app's own StatefulSet shows, for the lifecycle events.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OwnStatefulSet {
    /// `spec.replicas`.
    pub replicas: i32,
    /// The revision of its current pod template (`status.updateRevision`), once its
    /// controller has seen the current spec; None before.
    pub update_revision: Option<String>,
    /// The revision the operator last saw rolled out ([`ROLLED_OUT`]).
    pub announced: Option<String>,
    /// The pod the rollout drains ([`rollout::DRAINING`]).
    pub draining: Option<String>,
    /// The pod the rollout last restarted, and when ([`rollout::RESTARTED`]).
    pub restarted: Option<(String, k8s_openapi::jiff::Timestamp)>,
}

/// Annotation on the StatefulSet: the revision last seen rolled out, so a `RolledOut` event is
/// published once per rollout, by whichever operator replica leads.
pub const ROLLED_OUT: &str = "eddy.dev/rolled-out-revision";

/// An object that holds a name this app needs and is not controlled by it.
#[derive(Clone, Debug, PartialEq)]
pub struct Foreign {
    pub kind: Kind,
    pub name: String,
    /// Who controls it, for the message (e.g. "it has no controller").
    pub holder: String,
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
    /// Objects of `objects` not to apply: names held by others, the StatefulSet while
    /// something it needs is missing or the app may not run.
    pub hold: BTreeSet<Kind>,
    pub topics: Vec<InternalTopic>,
    pub status: AppStatus,
    pub events: Vec<Event>,
    /// Normal events about the StatefulSet (`Created`, `Scaled`, `RolledOut`): to publish only
    /// once it was applied, which also records that they were.
    pub lifecycle: Vec<Event>,
    pub problems: Vec<Problem>,
    /// What the assignor is doing (None when it did not run: the app cannot be placed).
    pub progress: Option<placement::Progress>,
    /// What the operator ignored in a previous assignment it did not write (pods that are
    /// not the app's, tasks it does not have, a forged generation), for the log; also told
    /// by a `ForgedStatusIgnored` Warning event.
    pub distrusted: Vec<String>,
    /// Where the rolling update stands (None: the StatefulSet is not the operator's to roll).
    pub rollout: Option<rollout::Plan>,
    /// The worker pod the rollout restarts now: the controller deletes it, if it still runs
    /// another revision than the one rolled out.
    pub restart: Option<Restart>,
}

/// A worker pod to evict for a rolling update.
#[derive(Clone, Debug, PartialEq)]
pub struct Restart {
    pub pod: String,
    /// The revision it is restarted into; a pod already running it is left alone.
    pub revision: String,
    /// Whether its active tasks were moved away first (else it restarts with them).
    pub drained: bool,
}

impl Desired {
    /// Whether something is in flight that the next reconcile should look at soon: moves
    /// waiting for a catch-up, a drain, a failed-over pod.
    pub fn in_flight(&self) -> bool {
        let halted = self.rollout.as_ref().is_some_and(rollout::Plan::halted);
        !halted
            && self
                .progress
                .as_ref()
                .is_some_and(|p| p.reason != placement::Reason::Stable)
    }

    /// Problems found while carrying the decision out (the API server refused an object):
    /// they join the status and, when new, become events.
    pub fn add_problems(
        &mut self,
        prev: &AppStatus,
        generation: Option<i64>,
        found: Vec<Problem>,
        now: &str,
    ) {
        if found.is_empty() {
            return;
        }
        self.events.extend(warnings(&found, prev));
        self.problems.extend(found);
        conclude(
            &mut self.status,
            prev,
            generation,
            &self.problems,
            self.progress.as_ref(),
            now,
        );
    }
}

/// Decide, with the operator's default worker settings. `now` is an RFC 3339 timestamp for
/// condition transitions.
pub fn reconcile(
    app: &StatefulStreamApp,
    observed: &Observed,
    kafka: &KafkaFacts,
    now: &str,
) -> Desired {
    reconcile_with(
        app,
        observed,
        kafka,
        now,
        &resources::WorkerSettings::default(),
    )
}

/// Decide, running the workers with `workers` (the operator's flags).
pub fn reconcile_with(
    app: &StatefulStreamApp,
    observed: &Observed,
    kafka: &KafkaFacts,
    now: &str,
    workers: &resources::WorkerSettings,
) -> Desired {
    // A valid change that would lose data waits for its acceptance: until then the app is
    // built from the spec its workers run.
    let gated = match eddy_crds::manifest::validate(&app.spec, "spec.") {
        Ok(()) => gate::check(app, observed.running.as_ref()),
        Err(_) => gate::Gate::Open,
    };
    let held;
    let (app, held_change) = match &gated {
        gate::Gate::Held { changes, running } => {
            held = gate::held_app(app, running);
            (&held, Some(gate::message(app, changes)))
        }
        _ => (app, None),
    };
    let name = resources::name(app);
    let prev = app.status.clone().unwrap_or_default();
    let replicas = app.spec.replicas.unwrap_or(1);
    let application_id = eddy_crds::manifest::application_id(
        app.metadata.namespace.as_deref(),
        &name,
        app.spec.application_id.as_deref(),
    );
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

    // Problems in the order they are found; the first one names the Degraded condition.
    let mut problems = Vec::new();
    if let Err(e) = eddy_crds::manifest::validate(&app.spec, "spec.") {
        problems.push(Problem::new(Reason::InvalidSpec, e.to_string()));
    }
    if app.spec.application_id.is_none()
        && let Err(e) = topics::check_name(&application_id)
    {
        problems.push(Problem::new(
            Reason::InvalidSpec,
            format!(
                "the default applicationId (<namespace>.<name>) is no valid Kafka topic prefix: {e}: set spec.applicationId"
            ),
        ));
    }
    let spec_hash = hash(&app.spec);
    let mut hold = BTreeSet::new();
    // An invalid spec changes no object: the workers keep running what they ran.
    let mut objects = match resources::build(app, &spec_hash, &application_id, workers) {
        Ok(o) if problems.is_empty() => Some(o),
        Ok(_) => None,
        Err(e) => {
            problems.push(Problem::new(Reason::InvalidSpec, e));
            None
        }
    };
    if let (Some(o), Some(digest)) = (objects.as_mut(), &observed.credentials_digest) {
        o.stateful_set
            .spec
            .template
            .metadata
            .get_or_insert_with(Default::default)
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(CREDENTIALS_DIGEST.to_string(), digest.clone());
    }

    let me = AppClaim {
        namespace: app.metadata.namespace.clone().unwrap_or_default(),
        name: name.clone(),
        uid: app.metadata.uid.clone(),
        created: app.metadata.creation_timestamp.as_ref().map(|t| t.0),
        application_id: application_id.clone(),
    };
    // The oldest other holder of the id keeps it; this app gets no workers. An existing
    // StatefulSet is scaled to 0 (not deleted: its volumes keep the state for when the
    // conflict is resolved), a missing one is not created.
    if let Some(holder) = observed
        .claims
        .iter()
        .filter(|c| me.yields_to(c))
        .min_by(|a, b| a.precedence().cmp(&b.precedence()))
    {
        problems.push(Problem::new(
            Reason::ApplicationIdConflict,
            format!(
                "applicationId {application_id:?} is already used by StatefulStreamApp {}/{} (created earlier): two apps with one id would share internal topics, consumer group and transactional ids; this app runs no workers until you set another spec.applicationId",
                holder.namespace, holder.name
            ),
        ));
        if let Some(o) = objects.as_mut() {
            o.stateful_set.spec.replicas = Some(0);
        }
        if observed.ready_replicas.is_none() {
            hold.insert(Kind::StatefulSet);
        }
    }

    for f in &observed.foreign {
        problems.push(Problem::new(
            Reason::NameConflict,
            format!(
                "{} {} already exists and is not this app's ({}): the operator leaves it alone; rename the app, or delete that {} so the operator can create its own",
                f.kind, f.name, f.holder, f.kind
            ),
        ));
        hold.insert(f.kind);
        if f.kind.needed_by_workers() {
            hold.insert(Kind::StatefulSet);
        }
    }

    let mut topics_to_create = Vec::new();
    let mut events = Vec::new();
    // An accepted loss is told while it is being applied: until the workers' ConfigMap holds
    // the new spec (once, unless that write fails; the recorder folds repeats into a series).
    if let gate::Gate::Accepted(changes) = &gated {
        events.push(Event {
            warning: false,
            reason: "ChangeAccepted".into(),
            message: gate::accepted(app, changes),
        });
    }
    let mut progress = None;
    let mut distrusted = Vec::new();
    let mut rollout_plan = None;
    let mut restart = None;
    // The tasks the app has, once Kafka said (reports are checked against them).
    let mut known_partitions: Option<Vec<i32>> = None;
    if problems.is_empty() {
        match kafka {
            KafkaFacts::Unreachable(e) => {
                problems.push(Problem::new(Reason::KafkaUnreachable, e.clone()))
            }
            // No pod may name a Secret the operator has not seen allowed: a missing one could
            // appear later without the label, and the kubelet would hand it to the worker. The
            // objects stay as they are (none is made), as for an invalid spec.
            KafkaFacts::CredentialsMissing(e) => {
                problems.push(Problem::new(Reason::KafkaCredentialsMissing, e.clone()));
                objects = None;
            }
            KafkaFacts::CredentialsNotAllowed(e) => {
                problems.push(Problem::new(Reason::KafkaCredentialsNotAllowed, e.clone()));
                objects = None;
            }
            KafkaFacts::Topics(existing) => {
                let layout = topics::layout(&application_id, &app.spec);
                let dead_letter = app.spec.on_error == eddy_crds::OnError::DeadLetter;
                let globals = topics::global_topics(&app.spec);
                match topics::plan(&application_id, &layout, &globals, dead_letter, |t| {
                    existing.get(t).copied()
                }) {
                    Err(e) => problems.push(Problem::new(
                        match e {
                            topics::PlanError::Missing(_) => Reason::SourceTopicMissing,
                            topics::PlanError::NotCopartitioned { .. } => Reason::NotCopartitioned,
                        },
                        e.to_string(),
                    )),
                    Ok((internal, partitions)) => {
                        known_partitions = Some(partitions.clone());
                        for t in &internal {
                            match existing.get(&t.name) {
                                Some(&n) if n != t.partitions => problems.push(Problem::new(
                                    Reason::InternalTopicMismatch,
                                    format!(
                                        "internal topic {:?} has {n} partitions, the app needs {}: delete it (its state will be rebuilt)",
                                        t.name, t.partitions
                                    ),
                                )),
                                Some(_) => {}
                                None => topics_to_create.push(t.clone()),
                            }
                        }
                        let known = placement::sanitize::Tasks(Some(&partitions));
                        let previous = prev
                            .assignment
                            .as_ref()
                            .map(|a| placement::sanitize::assignment(&name, known, a));
                        if let Some(p) = previous.as_ref().filter(|p| !p.dropped.is_empty()) {
                            distrusted.clone_from(&p.dropped);
                            events.push(Event {
                                warning: true,
                                reason: "ForgedStatusIgnored".into(),
                                message: format!(
                                    "status.assignment holds what the operator did not write, ignored and rewritten: {}; whoever may patch this app's status wrote it (its workers' ServiceAccount, unless the chart's admission policy is on: see docs/operator.md, \"Trust boundary\")",
                                    p.dropped.join("; ")
                                ),
                            });
                        }
                        let reports = placement::sanitize::reports(&name, known, &prev.workers);
                        let previous = previous.as_ref().map(|p| &p.assignment);
                        let health =
                            health(app, &name, replicas, previous, &reports, observed, now);
                        let plan = rollout::plan(&rollout_input(
                            app,
                            &name,
                            observed,
                            health.as_ref(),
                            previous,
                            &reports,
                            now,
                        ));
                        let placed = place(
                            app,
                            &Placing {
                                name: &name,
                                replicas,
                                layout: &layout,
                                partitions: &partitions,
                                previous,
                                reports: &reports,
                                draining: plan.draining(),
                                restarting: plan.restarting(),
                            },
                            health.as_ref(),
                            &prev,
                        );
                        restart = rollout::restart(
                            &plan,
                            Some(&placed.assignment),
                            &reports,
                            health.as_ref(),
                        );
                        rollout_plan = Some(plan);
                        if let Some(o) = objects.as_mut() {
                            o.stateful_set.spec.replicas = Some(cap_replicas(
                                placed.stateful_set_replicas,
                                replicas,
                                observed.stateful_set.as_ref(),
                            ));
                        }
                        let acceptable = acceptable_lag(app);
                        events.extend(
                            placement::describe_moves(&placed.moves, acceptable)
                                .into_iter()
                                .map(|(reason, message)| Event {
                                    warning: false,
                                    reason,
                                    message,
                                }),
                        );
                        status.assignment = Some(placed.assignment);
                        progress = Some(placed.progress);
                    }
                }
            }
        }
    }
    // No placement this time (Kafka unreachable, ...): a drain in progress keeps its pods.
    if progress.is_none()
        && let Some(o) = objects.as_mut()
        && o.stateful_set.spec.replicas == Some(replicas)
    {
        let hold = placement::hold_replicas(&name, replicas, prev.assignment.as_ref());
        o.stateful_set.spec.replicas =
            Some(cap_replicas(hold, replicas, observed.stateful_set.as_ref()));
    }
    // No placement: the rollout is shown, waiting; nothing restarts (no pod can be emptied).
    if rollout_plan.is_none() && problems.iter().all(|p| p.reason != Reason::InvalidSpec) {
        let reports =
            placement::sanitize::reports(&name, placement::sanitize::Tasks(None), &prev.workers);
        let previous = prev.assignment.as_ref().map(|a| {
            placement::sanitize::assignment(&name, placement::sanitize::Tasks(None), a).assignment
        });
        let health = health(
            app,
            &name,
            replicas,
            previous.as_ref(),
            &reports,
            observed,
            now,
        );
        rollout_plan = Some(rollout::plan(&rollout_input(
            app,
            &name,
            observed,
            health.as_ref(),
            None,
            &reports,
            now,
        )));
    }
    // Only the operator's own StatefulSet, and one it may change, is rolled.
    if hold.contains(&Kind::StatefulSet) || observed.stateful_set.is_none() {
        rollout_plan = None;
        restart = None;
    }
    let restart = restart.and_then(|pod| {
        let plan = rollout_plan.as_ref()?;
        let drained = plan.draining() == Some(pod.as_str());
        let revision = plan.revision.clone()?;
        Some(Restart {
            pod,
            revision,
            drained,
        })
    });
    if let Some(plan) = rollout_plan.as_ref().filter(|p| p.rolling()) {
        if let rollout::Step::Halted { pod, why, .. } = &plan.step {
            problems.push(Problem::new(
                Reason::RolloutHalted,
                format!(
                    "the rolling update to revision {} stopped at {pod}: {why}; the other pods keep the old template and their tasks. See why (kubectl describe pod {pod}, its logs), then fix the spec or change it back (a change back that would lose data needs accepting too, see ChangeLosesData): the rollout goes on by itself",
                    plan.revision.as_deref().unwrap_or("?")
                ),
            ));
        }
        // The rollout's step says more than the assignor's, unless a pod failed over or
        // leaving pods drain.
        let message = plan.message(restart.is_some(), acceptable_lag(app));
        match progress.as_mut() {
            Some(p)
                if matches!(
                    p.reason,
                    placement::Reason::FailingOver | placement::Reason::Draining
                ) => {}
            Some(p) => {
                if p.reason != placement::Reason::Stable {
                    p.message = format!("{message}; {}", p.message);
                } else {
                    p.message = message;
                }
                p.reason = placement::Reason::RollingUpdate;
            }
            None => {
                progress = Some(placement::Progress {
                    reason: placement::Reason::RollingUpdate,
                    message,
                    note: None,
                })
            }
        }
    }

    let rolled_out = rollout_plan.as_ref().and_then(|p| p.complete());
    // Told only for a rollout the status showed (pods restarted for it): a revision the pods
    // were created from is recorded silently.
    let rolled = prev
        .conditions
        .iter()
        .any(|c| c.type_ == "Progressing" && c.reason == placement::Reason::RollingUpdate.as_str());
    // What the next reconcile goes on from (omitted, the apply removes it): the pod drained
    // (rollout::DRAINING), and the pod restarted and when (rollout::RESTARTED), kept while
    // the rollout waits for that pod.
    if let Some(o) = objects.as_mut() {
        let sts = observed.stateful_set.as_ref();
        let draining = rollout_plan.as_ref().and_then(|p| p.draining());
        let recorded = sts
            .and_then(|s| s.restarted.as_ref())
            .map(|(pod, at)| (pod.as_str(), at.to_string()));
        let restarted = rollout_plan.as_ref().and_then(|plan| {
            rollout::restarted_annotation(
                plan,
                restart.as_ref().map(|r| r.pod.as_str()),
                recorded.as_ref().map(|(p, at)| (*p, at.as_str())),
                now,
            )
        });
        let annotations = o
            .stateful_set
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new);
        for (key, value) in [
            (rollout::DRAINING, draining.map(str::to_string)),
            (rollout::RESTARTED, restarted),
        ] {
            if let Some(v) = value {
                annotations.insert(key.to_string(), v);
            }
        }
    }
    let lifecycle = match objects.as_mut() {
        Some(o) if !hold.contains(&Kind::StatefulSet) => lifecycle(
            &name,
            &mut o.stateful_set,
            observed.stateful_set.as_ref(),
            rolled_out.map(|r| (r, rolled)),
        ),
        _ => Vec::new(),
    };

    // A worker's report goes once its pod is gone and the assignment gives it nothing (the
    // hand-off of its tasks may still look at it until then).
    status.workers.retain(|pod, _| {
        let assigned = status
            .assignment
            .as_ref()
            .is_some_and(|a| a.pods.contains_key(pod) || a.down.contains(pod));
        let exists = observed.pods.as_ref().is_some_and(|p| p.contains_key(pod));
        assigned || exists
    });
    // Only the reports of the app's own pods count, their numbers bounded ([`sanitize`]).
    let reports = placement::sanitize::reports(
        &name,
        placement::sanitize::Tasks(known_partitions.as_deref()),
        &status.workers,
    );
    status.backlog = placement::sanitize::backlog(&reports);
    // After the placement: a held change must not stop failover and scaling.
    if let Some(message) = held_change {
        problems.push(Problem::new(Reason::ChangeLosesData, message));
    }
    problems.extend(problems::from_workers(&reports));

    conclude(
        &mut status,
        &prev,
        app.metadata.generation,
        &problems,
        progress.as_ref(),
        now,
    );
    status.progress = progress_summary(&status, rollout_plan.as_ref());
    memory_condition(&mut status, &prev, &app.spec, app.metadata.generation, now);
    events.extend(warnings(&problems, &prev));
    Desired {
        objects,
        hold,
        topics: topics_to_create,
        status,
        events,
        lifecycle,
        problems,
        progress,
        distrusted,
        rollout: rollout_plan,
        restart,
    }
}

/// `status.progress`, the `Progress` column of `kubectl get`: the `Progressing` condition's
/// reason, with the pods done during a rolling update (`RollingUpdate 2/3`).
fn progress_summary(status: &AppStatus, plan: Option<&rollout::Plan>) -> Option<String> {
    let reason = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Progressing")
        .map(|c| c.reason.clone())?;
    Some(match plan {
        Some(p) if reason == placement::Reason::RollingUpdate.as_str() => p.summary(),
        _ => reason,
    })
}

/// The pods' health as the assignor and the rollout judge it (None: the pods are not
/// observed yet, all count as up).
fn health(
    app: &StatefulStreamApp,
    name: &str,
    replicas: i32,
    previous: Option<&eddy_crds::resource::Assignment>,
    reports: &BTreeMap<String, eddy_crds::resource::WorkerStatus>,
    observed: &Observed,
    now: &str,
) -> Option<BTreeMap<String, Health>> {
    observed.pods.as_ref().map(|pods| {
        let names = placement::pods_to_watch(name, replicas, previous);
        // An unreadable clock (unit tests pass labels) judges no pod late to start.
        let now = now.parse().unwrap_or(k8s_openapi::jiff::Timestamp::MIN);
        let fenced = app.spec.processing_guarantee == ProcessingGuarantee::ExactlyOnce;
        placement::health::assess(&names, pods, reports, &observed.report_ages, now, fenced)
    })
}

fn rollout_input<'a>(
    app: &'a StatefulStreamApp,
    name: &'a str,
    observed: &'a Observed,
    health: Option<&'a BTreeMap<String, Health>>,
    assignment: Option<&'a eddy_crds::resource::Assignment>,
    reports: &'a BTreeMap<String, eddy_crds::resource::WorkerStatus>,
    now: &str,
) -> rollout::Input<'a> {
    let sts = observed.stateful_set.as_ref();
    let now: Option<k8s_openapi::jiff::Timestamp> = now.parse().ok();
    let restarted = sts.and_then(|s| s.restarted.as_ref()).map(|(pod, at)| {
        let secs = now.map_or(0, |n| n.as_second().saturating_sub(at.as_second()));
        (pod.as_str(), u64::try_from(secs).unwrap_or(0))
    });
    rollout::Input {
        app: name,
        replicas: app.spec.replicas.unwrap_or(1),
        update_revision: sts.and_then(|s| s.update_revision.as_deref()),
        rolled_out: sts.and_then(|s| s.announced.as_deref()),
        draining: sts.and_then(|s| s.draining.as_deref()),
        restarted,
        revisions: observed.pods.as_ref().map(|_| &observed.revisions),
        health,
        assignment,
        reports,
        acceptable_lag: acceptable_lag(app).max(0),
    }
}

/// The StatefulSet's replicas to write: what the assignor asks (`wanted`: `spec.replicas`, or
/// more while leaving pods drain), but never more than `spec.replicas` or the StatefulSet
/// already has, and never more than `MAX_REPLICAS`. A drain only ever keeps pods that exist;
/// growing the StatefulSet past both could only come from a pod name someone else wrote into
/// the status.
pub fn cap_replicas(wanted: i32, replicas: i32, observed: Option<&OwnStatefulSet>) -> i32 {
    let has = observed.map_or(0, |s| s.replicas);
    wanted
        .min(replicas.max(has))
        .min(eddy_crds::manifest::MAX_REPLICAS)
}

/// The lifecycle steps applying `desired` takes, as Normal events: the StatefulSet created,
/// scaled (from the replicas it has to the ones it gets), or a change of its pod template
/// rolled out to every pod. Marks the rollout seen on `desired`, so it is told once.
fn lifecycle(
    name: &str,
    desired: &mut StatefulSet,
    observed: Option<&OwnStatefulSet>,
    rolled_out: Option<(&str, bool)>,
) -> Vec<Event> {
    let normal = |reason: &str, message: String| Event {
        warning: false,
        reason: reason.into(),
        message,
    };
    let to = desired.spec.replicas.unwrap_or(0);
    let Some(seen) = observed else {
        return vec![normal(
            "Created",
            format!(
                "created StatefulSet {name} with {to} worker pod(s), its headless Service, ConfigMap, ServiceAccount, Role, RoleBinding and PodDisruptionBudget"
            ),
        )];
    };
    let mut events = Vec::new();
    if seen.replicas != to {
        events.push(normal(
            "Scaled",
            format!(
                "scaled StatefulSet {name} from {} to {to} worker pod(s)",
                seen.replicas
            ),
        ));
    }
    // An app first seen by an operator that did not record rollouts yet gets no event.
    if let (Some((done, true)), Some(before)) = (rolled_out, &seen.announced)
        && done != before
    {
        events.push(normal(
            "RolledOut",
            format!(
                "the new worker pod template reached every pod of StatefulSet {name} ({} pod(s) restarted one at a time, each with its copies caught up; revision {done})",
                seen.replicas
            ),
        ));
    }
    if let Some(revision) = rolled_out.map(|(r, _)| r).or(seen.announced.as_deref()) {
        desired
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(ROLLED_OUT.to_string(), revision.to_string());
    }
    events
}

/// `warmup.acceptableRecoveryLag`, or its default.
pub fn acceptable_lag(app: &StatefulStreamApp) -> i64 {
    app.spec
        .warmup
        .as_ref()
        .and_then(|w| w.acceptable_recovery_lag)
        .unwrap_or(eddy_crds::spec::WarmupSpec::DEFAULT_ACCEPTABLE_RECOVERY_LAG)
}

/// What the assignor places for an app: its pods and tasks, the previous assignment and the
/// reports, the last two sanitized ([`placement::sanitize`]).
struct Placing<'a> {
    name: &'a str,
    replicas: i32,
    layout: &'a [topics::SubLayout],
    partitions: &'a [i32],
    previous: Option<&'a eddy_crds::resource::Assignment>,
    reports: &'a BTreeMap<String, eddy_crds::resource::WorkerStatus>,
    /// The rollout's pods ([`rollout::Plan::draining`], [`rollout::Plan::restarting`]).
    draining: Option<&'a str>,
    restarting: Option<&'a str>,
}

/// Run the assignor for this app: the pods' health ([`health`]), the rollout's pods and the
/// spec's standby and warm-up settings.
fn place(
    app: &StatefulStreamApp,
    p: &Placing,
    health: Option<&BTreeMap<String, Health>>,
    prev: &AppStatus,
) -> placement::Placement {
    let stateful: Vec<bool> = p.layout.iter().map(|s| !s.stores.is_empty()).collect();
    let warmup = app.spec.warmup.clone().unwrap_or_default();
    let previous_reason = prev
        .conditions
        .iter()
        .find(|c| c.type_ == "Progressing")
        .and_then(|c| placement::Reason::parse(&c.reason));
    placement::place(&placement::Input {
        app: p.name,
        partitions: p.partitions,
        stateful: &stateful,
        replicas: p.replicas,
        health,
        previous: p.previous,
        reports: p.reports,
        standby_replicas: usize::try_from(app.spec.num_standby_replicas.unwrap_or(0)).unwrap_or(0),
        max_warmups: usize::try_from(
            warmup
                .max_warmup_replicas
                .unwrap_or(eddy_crds::spec::WarmupSpec::DEFAULT_MAX_WARMUP_REPLICAS),
        )
        .unwrap_or(1)
        .max(1),
        acceptable_lag: acceptable_lag(app).max(0),
        previous_reason,
        draining: p.draining,
        restarting: p.restarting,
    })
}

/// The decision for an app whose spec cannot be read: no objects (what exists keeps
/// running as it was), the previous status with an `InvalidSpec` problem naming the field.
pub fn unreadable(meta: &ObjectMeta, prev: &AppStatus, message: &str, now: &str) -> Desired {
    let problems = vec![Problem::new(
        Reason::InvalidSpec,
        format!("the spec cannot be read: {message}: fix it (kubectl edit) or delete the app"),
    )];
    let mut status = AppStatus {
        observed_generation: meta.generation,
        ..prev.clone()
    };
    conclude(&mut status, prev, meta.generation, &problems, None, now);
    Desired {
        objects: None,
        hold: BTreeSet::new(),
        topics: Vec::new(),
        events: warnings(&problems, prev),
        lifecycle: Vec::new(),
        status,
        problems,
        progress: None,
        distrusted: Vec::new(),
        rollout: None,
        restart: None,
    }
}

/// The message for an object the API server refused: kind, name and its words; and when the
/// StatefulSet's volumes changed, which Kubernetes never allows, what to do about it.
pub fn refusal(
    kind: Kind,
    name: &str,
    message: &str,
    objects: &Objects,
    existing: Option<&StatefulSet>,
) -> String {
    let mut out = format!("{kind} {name}: {message}");
    let size = |s: &StatefulSet| {
        s.spec
            .volume_claim_templates
            .as_ref()?
            .first()?
            .spec
            .as_ref()?
            .resources
            .as_ref()?
            .requests
            .as_ref()?
            .get("storage")
            .map(|q| q.0.clone())
    };
    if kind == Kind::StatefulSet
        && let Some(old) = existing
        && let (Some(was), Some(wants)) = (size(old), size(&objects.stateful_set))
        && was != wants
    {
        out.push_str(&format!(
            " (spec.storage.size changed from {was} to {wants}, but Kubernetes never changes the volumes of an existing StatefulSet: set it back to {was}; or, to resize, grow each PersistentVolumeClaim state-{name}-<n> yourself if its StorageClass allows expansion, then `kubectl delete statefulset {name} --cascade=orphan`: the pods keep running and the operator creates the StatefulSet anew with {wants} for new pods)"
        ));
    }
    out
}

fn warnings(problems: &[Problem], prev: &AppStatus) -> Vec<Event> {
    problems::new_since(problems, prev)
        .into_iter()
        .map(|p| Event {
            warning: true,
            reason: p.reason.to_string(),
            message: p.message.clone(),
        })
        .collect()
}

/// Phase and conditions from the problems and what the workers report.
fn conclude(
    status: &mut AppStatus,
    prev: &AppStatus,
    generation: Option<i64>,
    problems: &[Problem],
    progress: Option<&placement::Progress>,
    now: &str,
) {
    let replicas = status.replicas;
    let current = status.assignment.as_ref().map_or(0, |a| a.generation);
    let all_applied = status.assignment.as_ref().is_some_and(|a| {
        a.pods.keys().all(|pod| {
            status
                .workers
                .get(pod)
                .is_some_and(|w| w.applied_generation == current)
        })
    });
    let all_running = status.assignment.as_ref().is_some_and(|a| {
        a.pods.iter().all(|(pod, t)| {
            status.workers.get(pod).is_some_and(|w| {
                t.active.iter().all(|id| {
                    w.tasks
                        .get(id)
                        .is_some_and(|s| s.state == TaskState::Running)
                })
            })
        })
    });
    let restoring = status
        .workers
        .values()
        .flat_map(|w| w.tasks.values())
        .any(|t| t.state == TaskState::Restoring);

    let degraded = problems::degraded(problems);
    let (phase, ready, progressing) = match &degraded {
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
    let p_message = match progress.and_then(|p| p.note.as_deref()) {
        Some(note) => format!("{p_message}; {note}"),
        None => p_message,
    };
    // What the assignor does (moving, draining, failing over) says more than the phase.
    let (progressing, p_reason, p_message) = match progress {
        Some(p) if degraded.is_none() && p.reason != placement::Reason::Stable => {
            (true, p.reason.as_str(), p.message.clone())
        }
        _ => (progressing, p_reason, p_message),
    };
    let (d_reason, d_message) = degraded.unwrap_or(("Healthy", "no problem found".to_string()));
    // Conditions set elsewhere (MemoryLimitLow) stay, after these three.
    let others: Vec<Condition> = std::mem::take(&mut status.conditions)
        .into_iter()
        .filter(|c| !["Ready", "Progressing", "Degraded"].contains(&c.type_.as_str()))
        .collect();
    status.conditions = vec![
        condition(
            prev,
            "Ready",
            ready,
            if ready { "Running" } else { "NotReady" },
            &format!("phase {phase:?}"),
            generation,
            now,
        ),
        condition(
            prev,
            "Progressing",
            progressing,
            p_reason,
            &p_message,
            generation,
            now,
        ),
        condition(
            prev,
            "Degraded",
            !problems.is_empty(),
            d_reason,
            &d_message,
            generation,
            now,
        ),
    ];
    status.conditions.extend(others);
}

/// `MemoryLimitLow`: True while `spec.resources` limits the worker's memory below what
/// `memory.budget` needs beside the rest of the process (a warning: the app runs).
fn memory_condition(
    status: &mut AppStatus,
    prev: &AppStatus,
    spec: &eddy_crds::spec::AppSpec,
    generation: Option<i64>,
    now: &str,
) {
    let warning = crate::memory::limit_warning(spec);
    let (reason, message) = match &warning {
        Some(w) => ("BelowBudget", w.clone()),
        None => (
            "Fits",
            "the memory limit leaves the budget room, or there is none".to_string(),
        ),
    };
    status.conditions.retain(|c| c.type_ != "MemoryLimitLow");
    status.conditions.push(condition(
        prev,
        "MemoryLimitLow",
        warning.is_some(),
        reason,
        &message,
        generation,
        now,
    ));
}

fn condition(
    prev: &AppStatus,
    type_: &str,
    on: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
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
        observed_generation: generation,
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
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

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
        assert_eq!(names, ["ns.pv-1-repartition", "ns.pv-c-changelog"]);
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
        let facts = kafka(&[
            ("views", 4),
            ("ns.pv-1-repartition", 4),
            ("ns.pv-c-changelog", 4),
        ]);
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
            &kafka(&[("views", 4), ("ns.pv-c-changelog", 2)]),
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
            "apiVersion: eddy.dev/v1alpha1\nkind: StatefulStreamApp\nmetadata: {name: pv}\nspec:\n  replicas: 2\n  numStandbyReplicas: -1\n  topology:\n    - from: {topic: views}\n",
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
        assert!(
            d.objects.is_none(),
            "the running workers are left as they are"
        );
    }

    fn report(d: &Desired, state: TaskState, backlog: i64) -> AppStatus {
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
                                    state,
                                    restore_backlog: backlog,
                                    ..Default::default()
                                },
                            )
                        })
                        .collect(),
                    ..Default::default()
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
        restoring.status = Some(report(&first, TaskState::Restoring, 10));
        let d = reconcile(
            &restoring,
            &Observed {
                ready_replicas: Some(0),
                ..Default::default()
            },
            &facts,
            "t1",
        );
        assert_eq!(d.status.phase, Some(Phase::Restoring));
        assert_eq!(d.status.backlog, 40, "4 tasks x 10 records");

        let mut running = app(PV);
        running.status = Some(report(&first, TaskState::Running, 0));
        let d = reconcile(
            &running,
            &Observed {
                ready_replicas: Some(2),
                ..Default::default()
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
    fn a_worker_that_cannot_process_makes_the_app_degraded_naming_its_pod() {
        use eddy_crds::resource::{WorkerProblem, WorkerProblemReason};
        let facts = kafka(&[("views", 2), ("out", 2)]);
        let first = reconcile(&app(PV), &Observed::default(), &facts, "t0");
        let mut stuck = app(PV);
        let mut status = report(&first, TaskState::Running, 0);
        if let Some(w) = status.workers.get_mut("pv-1") {
            w.problem = Some(WorkerProblem {
                reason: WorkerProblemReason::StateStoreUnavailable,
                message: "IO error: No space left on device".into(),
                since: Some("t1".into()),
            });
        }
        stuck.status = Some(status);
        let ready = Observed {
            ready_replicas: Some(2),
            ..Default::default()
        };
        let d = reconcile(&stuck, &ready, &facts, "t2");
        assert_eq!(d.status.phase, Some(Phase::Degraded));
        let (reason, message) = degraded(&d);
        assert_eq!(reason, "StateStoreUnavailable");
        assert!(
            message.contains("worker pv-1: IO error: No space left on device")
                && message.contains("since t1"),
            "{message}"
        );
        assert_eq!(d.events.len(), 1, "one Warning event");
        assert!(d.objects.is_some(), "the workers are left running");

        // The same problem again makes no second event; solved, the app is Running again.
        stuck.status = Some(d.status.clone());
        let again = reconcile(&stuck, &ready, &facts, "t3");
        assert!(again.events.is_empty());
        let mut solved = app(PV);
        let mut status = d.status;
        for w in status.workers.values_mut() {
            w.problem = None;
        }
        solved.status = Some(status);
        let d = reconcile(&solved, &ready, &facts, "t4");
        assert_eq!(d.status.phase, Some(Phase::Running));
    }

    #[test]
    fn scaling_in_drains_the_leaving_pod_and_drops_its_report_once_it_is_gone() {
        let facts = kafka(&[("views", 6), ("out", 6)]);
        let first = reconcile(&app(PV), &Observed::default(), &facts, "t0");
        let mut scaled = app(&PV.replace("replicas: 2", "replicas: 3"));
        scaled.status = Some(report(&first, TaskState::Running, 0));
        let d = reconcile(&scaled, &Observed::default(), &facts, "t1");
        let a = d.status.assignment.expect("assignment");
        assert_eq!(a.pods.len(), 3);
        assert_eq!(a.generation, 2);

        // Scale in: pv-1's tasks go to pv-0 (these workers report no lags: at once), but
        // pv-1 still reports them, so the StatefulSet keeps it and its report stays.
        let mut smaller = app(&PV.replace("replicas: 2", "replicas: 1"));
        smaller.status = Some(report(&first, TaskState::Running, 0));
        let two = Observed {
            stateful_set: Some(OwnStatefulSet {
                replicas: 2,
                ..Default::default()
            }),
            ..Default::default()
        };
        let d = reconcile(&smaller, &two, &facts, "t1");
        let sts = |d: &Desired| {
            d.objects
                .as_ref()
                .and_then(|o| o.stateful_set.spec.replicas)
        };
        assert_eq!(sts(&d), Some(2));
        let a = d.status.assignment.clone().expect("assignment");
        assert_eq!(a.pods["pv-0"].active.len(), 12);
        assert!(a.pods["pv-1"].active.is_empty());
        assert!(d.status.workers.contains_key("pv-1"));
        let progressing = |d: &Desired| {
            d.status
                .conditions
                .iter()
                .find(|c| c.type_ == "Progressing")
                .map(|c| (c.status.clone(), c.reason.clone()))
        };
        assert_eq!(progressing(&d), Some(("True".into(), "Draining".into())));
        assert!(
            d.events
                .iter()
                .any(|e| !e.warning && e.reason == "TasksMoved")
        );

        // pv-1 let go: the StatefulSet shrinks; the report goes once the pod is gone.
        let started = "2026-01-01T00:00:05Z".parse().expect("time");
        let now = "2026-01-01T00:00:10Z";
        smaller.status = Some(report(&d, TaskState::Running, 0));
        let mut pods = BTreeMap::from([
            ("pv-0".to_string(), PodObserved::Running { started }),
            ("pv-1".to_string(), PodObserved::Terminating),
        ]);
        let observed = |pods: &BTreeMap<String, PodObserved>| Observed {
            pods: Some(pods.clone()),
            ..Default::default()
        };
        let d = reconcile(&smaller, &observed(&pods), &facts, now);
        assert_eq!(sts(&d), Some(1));
        assert!(
            d.status.workers.contains_key("pv-1"),
            "its pod still exists"
        );
        assert!(
            d.status
                .assignment
                .as_ref()
                .is_some_and(|a| a.down.is_empty())
        );
        pods.remove("pv-1");
        smaller.status = Some(d.status.clone());
        let d = reconcile(&smaller, &observed(&pods), &facts, now);
        assert!(!d.status.workers.contains_key("pv-1"));
        assert_eq!(
            progressing(&d).map(|p| p.0),
            Some("True".into()),
            "tasks not running yet"
        );
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
            "replicas: 2\n  podTemplate: {metadata: {labels: {team: a}}, spec: {nodeSelector: {disk: ssd}, containers: [{name: worker, env: [{name: EXTRA, value: '1'}]}, {name: proxy, image: envoy}]}}\n",
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
        assert_eq!(pod.containers.len(), 2, "the sidecar is added");
        let worker = &pod.containers[0];
        assert_eq!(worker.name, "worker");
        assert_eq!(worker.args.as_deref(), Some(&["run".to_string()][..]));
        let env: Vec<&str> = worker
            .env
            .iter()
            .flatten()
            .map(|e| e.name.as_str())
            .collect();
        assert!(
            env.contains(&"EDDY_APP_FILE") && env.contains(&"EXTRA"),
            "{env:?}"
        );
        assert_eq!(pod.containers[1].image.as_deref(), Some("envoy"));
    }

    /// The reproduced attack: the app's only pod silent past the failover bound, and a status
    /// naming a pod of a huge ordinal, pods that do not exist, unknown tasks, a generation of
    /// i64::MAX, backlogs that overflow a sum. The operator writes a StatefulSet of
    /// `spec.replicas`, an assignment of the app's own pods and tasks under a new generation
    /// above what the workers applied, and says what it ignored.
    #[test]
    fn a_forged_status_scales_nothing_and_is_rewritten() {
        let one = PV.replace("replicas: 2", "replicas: 1");
        let facts = kafka(&[("views", 2), ("out", 2)]);
        let first = reconcile(&app(&one), &Observed::default(), &facts, "t0");
        let mut status = report(&first, TaskState::Running, i64::MAX);
        if let Some(w) = status.workers.get_mut("pv-0") {
            w.global_backlog = i64::MAX;
            w.updated = Some("2026-01-01T00:00:01Z".into());
        }
        let applied = first.status.assignment.as_ref().map_or(0, |a| a.generation);
        let mut a = status.assignment.clone().expect("assignment");
        let everything = a.pods["pv-0"].clone();
        for pod in ["pv-2147483646", "pv-999", "other-0"] {
            a.pods.insert(pod.into(), everything.clone());
        }
        a.pods
            .get_mut("pv-0")
            .expect("pv-0")
            .active
            .push("5_5".into());
        a.down.push("pv-2147483646".into());
        a.generation = i64::MAX;
        status.assignment = Some(a);
        // A report of a pod of another app, and one of a huge ordinal.
        for pod in ["other-0", "pv-2147483646"] {
            status.workers.insert(
                pod.into(),
                WorkerStatus {
                    global_backlog: i64::MAX,
                    applied_generation: i64::MAX,
                    ..Default::default()
                },
            );
        }
        let mut forged = app(&one);
        forged.status = Some(status);
        let started = "2026-01-01T00:00:00Z".parse().expect("time");
        let observed = Observed {
            pods: Some(BTreeMap::from([(
                "pv-0".to_string(),
                PodObserved::Running { started },
            )])),
            stateful_set: Some(OwnStatefulSet {
                replicas: 1,
                ..Default::default()
            }),
            // pv-0's report was first seen 45 s ago: it is down.
            report_ages: BTreeMap::from([("pv-0".to_string(), 45)]),
            ..Default::default()
        };
        let d = reconcile(&forged, &observed, &facts, "2026-01-01T00:00:46Z");
        let sts = d
            .objects
            .as_ref()
            .and_then(|o| o.stateful_set.spec.replicas);
        assert_eq!(sts, Some(1), "the StatefulSet stays at spec.replicas");
        let a = d.status.assignment.clone().expect("assignment");
        let pods: Vec<&str> = a.pods.keys().map(String::as_str).collect();
        assert!(
            pods.iter().all(|p| ["pv-0", "pv-999"].contains(p)),
            "{pods:?}"
        );
        assert!(a.down.iter().all(|p| p == "pv-0" || p == "pv-999"), "{a:?}");
        assert!(
            a.pods
                .values()
                .flat_map(|t| &t.active)
                .all(|id| id.starts_with("0_") || id.starts_with("1_")),
            "{a:?}"
        );
        assert_eq!(a.generation, applied + 1);
        assert_eq!(d.status.backlog, i64::MAX, "the sum saturates");
        assert!(
            !d.status.workers.contains_key("pv-2147483646")
                && !d.status.workers.contains_key("other-0"),
            "reports of pods that are not the app's go"
        );
        let told: Vec<&Event> = d
            .events
            .iter()
            .filter(|e| e.reason == "ForgedStatusIgnored")
            .collect();
        assert_eq!(told.len(), 1, "{:?}", d.events);
        assert!(
            told[0].warning && told[0].message.contains("pv-2147483646"),
            "{:?}",
            told
        );
        assert!(told[0].message.contains("5_5") && told[0].message.contains(&i64::MAX.to_string()));
        assert!(!d.distrusted.is_empty());

        // Written back, the status is the operator's own again: nothing more to say.
        let mut again = app(&one);
        again.status = Some(d.status.clone());
        let d2 = reconcile(&again, &observed, &facts, "2026-01-01T00:00:47Z");
        assert!(d2.distrusted.is_empty(), "{:?}", d2.distrusted);
        assert!(d2.events.iter().all(|e| e.reason != "ForgedStatusIgnored"));

        // Kafka unreachable: no placement, and the StatefulSet still does not grow.
        let d = reconcile(
            &forged,
            &observed,
            &KafkaFacts::Unreachable("down".into()),
            "t9",
        );
        let sts = d
            .objects
            .as_ref()
            .and_then(|o| o.stateful_set.spec.replicas);
        assert_eq!(sts, Some(1));
    }

    #[test]
    fn the_stateful_set_never_grows_past_spec_or_what_it_has() {
        let has = |n: i32| OwnStatefulSet {
            replicas: n,
            ..Default::default()
        };
        assert_eq!(cap_replicas(5, 2, None), 2, "a new StatefulSet");
        assert_eq!(
            cap_replicas(3, 1, Some(&has(3))),
            3,
            "a drain keeps its pods"
        );
        assert_eq!(cap_replicas(1000, 1, Some(&has(3))), 3);
        assert_eq!(cap_replicas(4, 4, Some(&has(1))), 4, "scaling out");
        assert_eq!(cap_replicas(i32::MAX, i32::MAX, Some(&has(i32::MAX))), 1000);
    }

    /// A worker silent for 31 s on the operator's clock is failed over whatever its report's
    /// time says; one seen a moment ago is up even if its clock is far behind.
    #[test]
    fn silence_is_the_operators_own_observation() {
        let facts = kafka(&[("views", 2), ("out", 2)]);
        let first = reconcile(&app(PV), &Observed::default(), &facts, "t0");
        let mut status = report(&first, TaskState::Running, 0);
        for w in status.workers.values_mut() {
            // A clock an hour behind the operator's.
            w.updated = Some("2026-01-01T00:00:10Z".into());
        }
        let mut a = app(PV);
        a.status = Some(status);
        let started = "2026-01-01T00:00:00Z".parse().expect("time");
        let pods: BTreeMap<String, PodObserved> = ["pv-0", "pv-1"]
            .iter()
            .map(|p| (p.to_string(), PodObserved::Running { started }))
            .collect();
        let now = "2026-01-01T01:00:00Z";
        let seen = |ages: &[(&str, u64)]| Observed {
            pods: Some(pods.clone()),
            report_ages: ages.iter().map(|(p, s)| (p.to_string(), *s)).collect(),
            ..Default::default()
        };
        let d = reconcile(&a, &seen(&[("pv-0", 1), ("pv-1", 2)]), &facts, now);
        assert!(
            d.status
                .assignment
                .as_ref()
                .is_some_and(|a| a.down.is_empty())
        );
        let d = reconcile(&a, &seen(&[("pv-0", 1), ("pv-1", 31)]), &facts, now);
        assert_eq!(
            d.status.assignment.as_ref().map(|a| a.down.clone()),
            Some(vec!["pv-1".to_string()])
        );
        assert!(
            d.events
                .iter()
                .any(|e| e.reason == "TasksFailedOver" && e.message.contains("31s")),
            "{:?}",
            d.events
        );
    }

    /// A changed template (revision r2 over r1): the highest pod is emptied first, restarted
    /// once its worker let its tasks go, and a restarted pod that crash-loops halts the
    /// rollout with a Degraded reason; `kubectl get` shows the progress.
    #[test]
    fn a_rollout_empties_a_pod_restarts_it_and_halts_on_a_failing_one() {
        let facts = kafka(&[("views", 4), ("out", 4)]);
        let started: k8s_openapi::jiff::Timestamp = "2026-01-01T00:00:00Z".parse().expect("time");
        let now = "2026-01-01T00:01:00Z";
        let with_reports = |d: &Desired| {
            let mut a = app(PV);
            let mut s = report(d, TaskState::Running, 0);
            for w in s.workers.values_mut() {
                w.updated = Some("2026-01-01T00:00:59Z".into());
            }
            a.status = Some(s);
            a
        };
        let observed = |pv1: PodObserved, pv1_revision: &str| Observed {
            pods: Some(BTreeMap::from([
                ("pv-0".to_string(), PodObserved::Running { started }),
                ("pv-1".to_string(), pv1),
            ])),
            revisions: BTreeMap::from([
                ("pv-0".to_string(), "r1".to_string()),
                ("pv-1".to_string(), pv1_revision.to_string()),
            ]),
            stateful_set: Some(OwnStatefulSet {
                replicas: 2,
                update_revision: Some("r2".into()),
                announced: Some("r1".into()),
                draining: None,
                restarted: None,
            }),
            ..Default::default()
        };
        let first = reconcile(&app(PV), &Observed::default(), &facts, "t0");
        let running = observed(PodObserved::Running { started }, "r1");
        let d = reconcile(&with_reports(&first), &running, &facts, now);
        let a = d.status.assignment.as_ref().expect("assignment");
        assert!(a.pods["pv-1"].active.is_empty(), "{a:?}");
        assert_eq!(a.pods["pv-0"].active.len(), 8, "both sub-topologies' tasks");
        assert_eq!(d.restart, None, "its worker still runs its tasks");
        assert_eq!(d.status.progress.as_deref(), Some("RollingUpdate 0/2"));
        let (reason, message) = progressing(&d);
        assert_eq!(reason, "RollingUpdate");
        assert!(
            message.contains("moving pv-1's active tasks to caught-up copies"),
            "{message}"
        );
        // Its worker let them go: restart it, into r2.
        let d = reconcile(&with_reports(&d), &running, &facts, now);
        assert_eq!(
            d.restart,
            Some(Restart {
                pod: "pv-1".into(),
                revision: "r2".into(),
                drained: true,
            })
        );
        // Back on r2 and crash-looping: halted, pv-0 is not touched.
        let failing = PodObserved::Failing {
            reason: "CrashLoopBackOff".into(),
        };
        let d = reconcile(&with_reports(&d), &observed(failing, "r2"), &facts, now);
        assert_eq!(d.restart, None);
        let (reason, message) = degraded(&d);
        assert_eq!(reason, "RolloutHalted");
        assert!(
            message.contains("stopped at pv-1: it runs the new pod template and is down (its worker container is not running: CrashLoopBackOff)"),
            "{message}"
        );
        assert!(
            Reason::RolloutHalted.owner_fixes(),
            "a warning (EddyAppMisconfigured): the new template is the owner's"
        );
    }

    /// A new spec that drops a store is held: the objects are built from the running spec
    /// (with the new replicas), tasks are still placed, and the app says how to accept it.
    #[test]
    fn a_change_that_drops_a_store_keeps_the_running_spec_until_accepted() {
        let facts = kafka(&[("views", 2), ("out", 2)]);
        let running = app(PV).spec;
        let renamed = || {
            let mut a = app(&PV
                .replace("store: c", "store: d")
                .replace("replicas: 2", "replicas: 3"));
            a.metadata.generation = Some(4);
            a
        };
        let observed = Observed {
            running: Some(running.clone()),
            ..Default::default()
        };
        let app_file = |d: &Desired| {
            d.objects
                .as_ref()
                .expect("objects")
                .config_map
                .data
                .as_ref()
                .expect("data")["app.yaml"]
                .clone()
        };
        let d = reconcile(&renamed(), &observed, &facts, "t0");
        let (reason, message) = degraded(&d);
        assert_eq!(reason, "ChangeLosesData");
        assert!(message.contains("store c"), "{message}");
        assert!(message.contains("eddy.dev/accept-data-loss=4"), "{message}");
        assert!(app_file(&d).contains("store: c"), "{}", app_file(&d));
        let sts = &d.objects.as_ref().expect("objects").stateful_set;
        assert_eq!(sts.spec.replicas, Some(3), "the new replicas still apply");
        assert!(d.status.assignment.is_some(), "tasks are still placed");
        // Accepted for generation 4: applied.
        let mut accepted = renamed();
        accepted.metadata.annotations = Some([(gate::ACCEPT.to_string(), "4".to_string())].into());
        let d = reconcile(&accepted, &observed, &facts, "t1");
        assert!(d.problems.is_empty(), "{:?}", d.problems);
        assert!(app_file(&d).contains("store: d"));
        let told: Vec<&Event> = d
            .events
            .iter()
            .filter(|e| e.reason == "ChangeAccepted")
            .collect();
        assert!(
            told.len() == 1 && !told[0].warning && told[0].message.contains("store c"),
            "{:?}",
            d.events
        );
        // Applied: the workers' ConfigMap holds the new spec, nothing more to tell.
        let applied = Observed {
            running: Some(accepted.spec.clone()),
            ..Default::default()
        };
        let d = reconcile(&accepted, &applied, &facts, "t2");
        assert!(
            d.events.iter().all(|e| e.reason != "ChangeAccepted"),
            "{:?}",
            d.events
        );
    }

    #[test]
    fn pods_update_on_delete_and_a_credentials_digest_reaches_the_template() {
        let facts = kafka(&[("views", 2), ("out", 2)]);
        let template = |observed: &Observed| {
            let d = reconcile(&app(PV), observed, &facts, "t0");
            let sts = d.objects.expect("objects").stateful_set;
            let strategy = sts.spec.update_strategy.and_then(|u| u.type_);
            assert_eq!(strategy.as_deref(), Some("OnDelete"));
            sts.spec
                .template
                .metadata
                .and_then(|m| m.annotations)
                .and_then(|a| a.get(CREDENTIALS_DIGEST).cloned())
        };
        assert_eq!(
            template(&Observed::default()),
            None,
            "no Secret: the template is as before (no roll on an operator upgrade)"
        );
        let rotated = Observed {
            credentials_digest: Some("0123abcd".into()),
            ..Default::default()
        };
        assert_eq!(template(&rotated).as_deref(), Some("0123abcd"));
    }

    fn progressing(d: &Desired) -> (String, String) {
        let c = d
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == "Progressing")
            .expect("Progressing");
        (c.reason.clone(), c.message.clone())
    }

    fn degraded(d: &Desired) -> (String, String) {
        let c = d
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == "Degraded" && c.status == "True")
            .expect("Degraded");
        (c.reason.clone(), c.message.clone())
    }

    fn env_of(d: &Desired, name: &str) -> Option<String> {
        let pod = d
            .objects
            .as_ref()?
            .stateful_set
            .spec
            .template
            .spec
            .as_ref()?;
        pod.containers[0]
            .env
            .iter()
            .flatten()
            .find(|e| e.name == name)?
            .value
            .clone()
    }

    #[test]
    fn the_default_application_id_is_the_namespace_and_the_name() {
        let facts = kafka(&[("views", 2)]);
        let d = reconcile(&app(PV), &Observed::default(), &facts, "t0");
        assert_eq!(env_of(&d, "EDDY_APPLICATION_ID").as_deref(), Some("ns.pv"));
        let explicit = app(&PV.replace("replicas: 2\n", "replicas: 2\n  applicationId: views\n"));
        let d = reconcile(&explicit, &Observed::default(), &facts, "t0");
        assert_eq!(env_of(&d, "EDDY_APPLICATION_ID").as_deref(), Some("views"));
        assert!(d.topics.iter().all(|t| t.name.starts_with("views-")));
    }

    #[test]
    fn workers_log_in_the_operators_worker_log_format_unless_the_pod_template_says_otherwise() {
        let facts = kafka(&[("views", 2)]);
        let d = reconcile(&app(PV), &Observed::default(), &facts, "t0");
        assert_eq!(
            env_of(&d, "EDDY_LOG_FORMAT"),
            None,
            "the default leaves the pods as they were"
        );
        let json = resources::WorkerSettings {
            log_format: eddy_telemetry::logging::LogFormat::Json,
            ..Default::default()
        };
        let d = reconcile_with(&app(PV), &Observed::default(), &facts, "t0", &json);
        assert_eq!(env_of(&d, "EDDY_LOG_FORMAT").as_deref(), Some("json"));
        let own = app(&PV.replace(
            "replicas: 2\n",
            "replicas: 2\n  podTemplate: {spec: {containers: [{name: worker, env: [{name: EDDY_LOG_FORMAT, value: text}]}]}}\n",
        ));
        let d = reconcile_with(&own, &Observed::default(), &facts, "t0", &json);
        assert_eq!(env_of(&d, "EDDY_LOG_FORMAT").as_deref(), Some("text"));
    }

    #[test]
    fn workers_run_the_apps_image_else_the_operators_worker_image_else_the_crate_versions() {
        let facts = kafka(&[("views", 2)]);
        let image = |d: &Desired| {
            let o = d.objects.as_ref().expect("objects");
            let pod = o
                .stateful_set
                .spec
                .template
                .spec
                .as_ref()
                .expect("pod spec");
            pod.containers[0].image.clone()
        };
        let d = reconcile(&app(PV), &Observed::default(), &facts, "t0");
        assert_eq!(
            image(&d).as_deref(),
            Some(concat!(
                "ghcr.io/eddy-dev/eddy-worker:",
                env!("CARGO_PKG_VERSION")
            ))
        );
        let mirror = resources::WorkerSettings {
            image: Some("registry.example.com/team/eddy-worker:0.1.0".into()),
            ..Default::default()
        };
        let d = reconcile_with(&app(PV), &Observed::default(), &facts, "t0", &mirror);
        assert_eq!(
            image(&d).as_deref(),
            Some("registry.example.com/team/eddy-worker:0.1.0")
        );
        let own = app(&PV.replace("replicas: 2\n", "replicas: 2\n  image: mine:1\n"));
        let d = reconcile_with(&own, &Observed::default(), &facts, "t0", &mirror);
        assert_eq!(
            image(&d).as_deref(),
            Some("mine:1"),
            "the app's spec.image wins"
        );
    }

    #[test]
    fn creating_scaling_and_rolling_out_the_statefulset_are_normal_events_told_once() {
        let facts = kafka(&[("views", 2), ("out", 2)]);
        let seen = |replicas, announced: Option<&str>| Observed {
            ready_replicas: Some(replicas),
            stateful_set: Some(OwnStatefulSet {
                replicas,
                update_revision: None,
                announced: announced.map(str::to_string),
                draining: None,
                restarted: None,
            }),
            ..Default::default()
        };
        let told = |d: &Desired| -> Vec<(String, String)> {
            d.lifecycle
                .iter()
                .inspect(|e| assert!(!e.warning, "{e:?}"))
                .map(|e| (e.reason.clone(), e.message.clone()))
                .collect()
        };
        let annotation = |s: &StatefulSet| {
            s.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ROLLED_OUT).cloned())
        };

        let d = reconcile(&app(PV), &Observed::default(), &facts, "t0");
        let events = told(&d);
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].0, "Created");
        assert!(
            events[0].1.contains("StatefulSet pv with 2 worker pod(s)"),
            "{events:?}"
        );
        assert!(d.events.iter().all(|e| e.reason != "Created"));

        let three = app(&PV.replace("replicas: 2", "replicas: 3"));
        let d = reconcile(&three, &seen(2, Some("pv-1")), &facts, "t2");
        assert_eq!(
            told(&d),
            [(
                "Scaled".to_string(),
                "scaled StatefulSet pv from 2 to 3 worker pod(s)".to_string()
            )]
        );
        let sts = || d.objects.as_ref().expect("objects").stateful_set.clone();
        assert_eq!(annotation(&sts()).as_deref(), Some("pv-1"), "kept");

        // The rollout's end (crate::rollout decides it) is recorded; told once, except the
        // first one seen, which is the creation's.
        let rolled = |announced: Option<&str>, done: Option<&str>| {
            let mut s = sts();
            let observed = seen(3, announced).stateful_set;
            let events = lifecycle("pv", &mut s, observed.as_ref(), done.map(|d| (d, true)));
            (events, annotation(&s))
        };
        let (events, recorded) = rolled(None, Some("pv-1"));
        assert!(events.is_empty(), "{events:?}");
        assert_eq!(recorded.as_deref(), Some("pv-1"));
        let (events, recorded) = rolled(Some("pv-1"), None);
        assert!(events.is_empty(), "{events:?}");
        assert_eq!(
            recorded.as_deref(),
            Some("pv-1"),
            "under way: the last one stays"
        );
        let (events, recorded) = rolled(Some("pv-1"), Some("pv-2"));
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].reason, "RolledOut");
        assert!(
            events[0].message.contains("every pod of StatefulSet pv (3 pod(s) restarted one at a time, each with its copies caught up; revision pv-2)"),
            "{events:?}"
        );
        assert_eq!(recorded.as_deref(), Some("pv-2"));
        assert!(rolled(Some("pv-2"), Some("pv-2")).0.is_empty());

        // A StatefulSet held back (its name is someone else's) is neither created nor told.
        let taken = Observed {
            foreign: vec![Foreign {
                kind: Kind::StatefulSet,
                name: "pv".into(),
                holder: "it has no owner".into(),
            }],
            ..Default::default()
        };
        assert_eq!(told(&reconcile(&app(PV), &taken, &facts, "t6")), []);
    }

    fn claim(ns: &str, name: &str, day: u8, id: &str) -> AppClaim {
        AppClaim {
            namespace: ns.into(),
            name: name.into(),
            uid: Some(format!("{ns}/{name}")),
            created: format!("2024-01-0{day}T00:00:00Z").parse().ok(),
            application_id: id.into(),
        }
    }

    #[test]
    fn a_newer_app_with_a_used_application_id_gets_no_workers() {
        let with_id = |day: u8| {
            let mut a = app(&PV.replace("replicas: 2\n", "replicas: 2\n  applicationId: shared\n"));
            a.metadata.creation_timestamp = Some(Time(
                format!("2024-01-0{day}T00:00:00Z").parse().expect("time"),
            ));
            a
        };
        let claims = vec![
            claim("other", "first", 1, "shared"),
            claim("ns", "pv", 2, "shared"),
        ];
        let observed = Observed {
            claims: claims.clone(),
            ..Default::default()
        };
        let facts = kafka(&[("views", 2)]);
        let d = reconcile(&with_id(2), &observed, &facts, "t0");
        let (reason, message) = degraded(&d);
        assert_eq!(reason, "ApplicationIdConflict");
        assert!(message.contains("other/first"), "{message}");
        assert!(
            d.hold.contains(&Kind::StatefulSet),
            "no StatefulSet is created"
        );
        assert!(d.topics.is_empty(), "no topics for a refused app");
        assert_eq!(d.events.len(), 1);

        // One that runs already is scaled to 0, not deleted (its volumes keep the state).
        let running = Observed {
            ready_replicas: Some(2),
            claims: claims.clone(),
            ..Default::default()
        };
        let d = reconcile(&with_id(2), &running, &facts, "t0");
        assert!(!d.hold.contains(&Kind::StatefulSet));
        assert_eq!(
            d.objects.expect("objects").stateful_set.spec.replicas,
            Some(0)
        );

        // The older app is not touched by the newer one.
        let mut first = with_id(1);
        first.metadata.name = Some("first".into());
        first.metadata.namespace = Some("other".into());
        first.metadata.uid = Some("other/first".into());
        let d = reconcile(&first, &observed, &facts, "t0");
        assert_eq!(d.status.phase, Some(Phase::Pending));
        assert!(d.hold.is_empty());
    }

    #[test]
    fn names_held_by_others_are_left_alone_and_named() {
        let facts = kafka(&[("views", 2)]);
        let observed = Observed {
            foreign: vec![Foreign {
                kind: Kind::ConfigMap,
                name: "pv-app".into(),
                holder: "it has no owner".into(),
            }],
            ..Default::default()
        };
        let d = reconcile(&app(PV), &observed, &facts, "t0");
        let (reason, message) = degraded(&d);
        assert_eq!(reason, "NameConflict");
        assert!(
            message.contains("ConfigMap pv-app") && message.contains("rename the app"),
            "{message}"
        );
        assert!(d.hold.contains(&Kind::ConfigMap));
        assert!(
            d.hold.contains(&Kind::StatefulSet),
            "pods would mount someone else's app file"
        );
        assert!(!d.hold.contains(&Kind::Service));

        let observed = Observed {
            foreign: vec![Foreign {
                kind: Kind::Service,
                name: "pv-workers".into(),
                holder: "its controller is Deployment web".into(),
            }],
            ..Default::default()
        };
        let d = reconcile(&app(PV), &observed, &facts, "t0");
        assert_eq!(d.hold, BTreeSet::from([Kind::Service]));
    }

    #[test]
    fn a_refused_object_is_a_problem_with_one_event() {
        let facts = kafka(&[("views", 2)]);
        let mut d = reconcile(&app(PV), &Observed::default(), &facts, "t0");
        assert!(d.problems.is_empty());
        let refused = || {
            vec![Problem::new(
                Reason::ApplyFailed,
                "StatefulSet pv: spec: Forbidden: updates to statefulset spec are forbidden",
            )]
        };
        d.add_problems(&AppStatus::default(), Some(3), refused(), "t1");
        let (reason, message) = degraded(&d);
        assert_eq!(reason, "ApplyFailed");
        assert!(
            message.starts_with("StatefulSet pv: spec: Forbidden"),
            "{message}"
        );
        assert_eq!(d.status.phase, Some(Phase::Degraded));
        assert_eq!(d.events.len(), 1);

        let mut again = app(PV);
        again.status = Some(d.status.clone());
        let mut d2 = reconcile(&again, &Observed::default(), &facts, "t2");
        d2.add_problems(&d.status, Some(3), refused(), "t2");
        assert!(
            d2.events.is_empty(),
            "the same refusal is not announced twice"
        );
        let since = d2
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == "Degraded")
            .and_then(|c| c.last_transition_time.clone());
        assert_eq!(since.as_deref(), Some("t1"));
    }

    #[test]
    fn a_refused_storage_change_says_what_to_do() {
        let facts = kafka(&[("views", 2)]);
        let old = reconcile(&app(PV), &Observed::default(), &facts, "t0");
        let bigger = app(&PV.replace("replicas: 2\n", "replicas: 2\n  storage: {size: 5Gi}\n"));
        let new = reconcile(&bigger, &Observed::default(), &facts, "t0");
        let objects = new.objects.expect("objects");
        let existing = old.objects.expect("objects").stateful_set;
        let m = refusal(
            Kind::StatefulSet,
            "pv",
            "spec: Forbidden: updates to statefulset spec for fields other than 'replicas' are forbidden",
            &objects,
            Some(&existing),
        );
        assert!(m.starts_with("StatefulSet pv: spec: Forbidden"), "{m}");
        assert!(
            m.contains("from 1Gi to 5Gi") && m.contains("--cascade=orphan"),
            "{m}"
        );
        let plain = refusal(Kind::Service, "pv-workers", "invalid", &objects, None);
        assert_eq!(plain, "Service pv-workers: invalid");
    }

    #[test]
    fn an_unreadable_app_is_degraded_and_keeps_what_it_had() {
        let facts = kafka(&[("views", 2)]);
        let first = reconcile(&app(PV), &Observed::default(), &facts, "t0");
        let a = app(PV);
        let d = unreadable(
            &a.metadata,
            &first.status,
            "spec.topology[1]: data did not match any variant of untagged enum GroupBy",
            "t1",
        );
        let (reason, message) = degraded(&d);
        assert_eq!(reason, "InvalidSpec");
        assert!(message.contains("spec.topology[1]"), "{message}");
        assert!(d.objects.is_none(), "nothing is applied");
        assert_eq!(d.status.assignment, first.status.assignment);
        assert_eq!(d.events.len(), 1);
    }

    #[test]
    fn worker_pods_pass_the_restricted_pod_security_standard() {
        let d = reconcile(
            &app(PV),
            &Observed::default(),
            &kafka(&[("views", 2)]),
            "t0",
        );
        let pod = d
            .objects
            .expect("objects")
            .stateful_set
            .spec
            .template
            .spec
            .expect("pod spec");
        let ps = pod.security_context.expect("pod securityContext");
        assert_eq!(ps.run_as_non_root, Some(true));
        assert!(ps.run_as_user.is_some_and(|u| u > 0));
        assert!(ps.run_as_group.is_some_and(|g| g > 0));
        assert_eq!(ps.fs_group, ps.run_as_group, "the state volume is writable");
        assert_eq!(
            ps.seccomp_profile.map(|p| p.type_).as_deref(),
            Some("RuntimeDefault")
        );
        for c in &pod.containers {
            let cs = c
                .security_context
                .clone()
                .expect("container securityContext");
            assert_eq!(cs.allow_privilege_escalation, Some(false));
            assert_eq!(cs.read_only_root_filesystem, Some(true));
            assert_eq!(
                cs.capabilities.and_then(|c| c.drop),
                Some(vec!["ALL".to_string()])
            );
            let state = c
                .volume_mounts
                .iter()
                .flatten()
                .find(|m| m.mount_path == resources::STATE_DIR)
                .expect("state volume");
            assert_ne!(state.read_only, Some(true));
        }
        for v in pod.volumes.iter().flatten() {
            assert!(
                v.config_map.is_some() || v.secret.is_some(),
                "volume {} is of a type restricted allows",
                v.name
            );
        }
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
            "replicas: 2\n  kafka:\n    sasl: {mechanism: SCRAM-SHA-512, username: alice, password: {secretKeyRef: {name: creds, key: pass}}}\n",
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
        let (reason, message) = degraded(&d);
        assert_eq!(reason, "KafkaCredentialsMissing");
        assert!(message.contains("ns/creds"), "{message}");
        assert!(d.topics.is_empty() && d.status.assignment.is_none());
        assert!(
            d.objects.is_none(),
            "no pod names a Secret that may appear later without the label"
        );
        assert_eq!(d.events.len(), 1);
    }

    #[test]
    fn the_query_port_admits_the_apps_own_pods_and_its_named_peers_only() {
        let with = app(&PV.replace(
            "replicas: 2\n",
            "replicas: 2\n  queries: {from: [{podSelector: {matchLabels: {role: web}}}, {ipBlock: {cidr: 10.1.0.0/16}}]}\n",
        ));
        let d = reconcile(&with, &Observed::default(), &kafka(&[("views", 2)]), "t0");
        let o = d.objects.expect("objects");
        let policy =
            serde_json::to_value(o.network_policy.expect("a NetworkPolicy")).expect("serializable");
        assert_eq!(policy["metadata"]["name"], "pv-query");
        let spec = &policy["spec"];
        let own = serde_json::json!({"app.kubernetes.io/name": "eddy-worker", "app.kubernetes.io/instance": "pv"});
        assert_eq!(spec["podSelector"]["matchLabels"], own);
        assert_eq!(spec["policyTypes"], serde_json::json!(["Ingress"]));
        let rules = spec["ingress"].as_array().expect("rules");
        assert_eq!(rules.len(), 2);
        assert_eq!(
            rules[0],
            serde_json::json!({
                "from": [
                    {"podSelector": {"matchLabels": own}},
                    {"podSelector": {"matchLabels": {"role": "web"}}},
                    {"ipBlock": {"cidr": "10.1.0.0/16"}},
                ],
                "ports": [{"port": 9091, "protocol": "TCP"}],
            })
        );
        // Every other port, from anywhere: 9091 is the only one closed.
        assert_eq!(
            rules[1],
            serde_json::json!({
                "ports": [
                    {"port": 1, "endPort": 9090, "protocol": "TCP"},
                    {"port": 9092, "endPort": 65535, "protocol": "TCP"},
                    {"protocol": "UDP"},
                    {"protocol": "SCTP"},
                ],
            })
        );
        // Queries off: no policy (the controller deletes an existing one).
        let off = app(&PV.replace(
            "replicas: 2\n",
            "replicas: 2\n  queries: {enabled: false}\n",
        ));
        let d = reconcile(&off, &Observed::default(), &kafka(&[("views", 2)]), "t0");
        assert!(d.objects.expect("objects").network_policy.is_none());
    }

    #[test]
    fn a_secret_not_allowed_as_a_credential_makes_no_pod_that_names_it() {
        let d = reconcile(
            &app(PV),
            &Observed::default(),
            &KafkaFacts::CredentialsNotAllowed(
                "spec.kafka.sasl.password: secret ns/creds may not be used by this app".into(),
            ),
            "t0",
        );
        assert_eq!(d.status.phase, Some(Phase::Degraded));
        let (reason, message) = degraded(&d);
        assert_eq!(reason, "KafkaCredentialsNotAllowed");
        assert!(message.contains("ns/creds"), "{message}");
        assert!(
            d.objects.is_none(),
            "no object is made or changed: a StatefulSet would name the Secret"
        );
        assert!(d.topics.is_empty() && d.status.assignment.is_none());
    }

    #[test]
    fn worker_role_only_reads_its_app_patches_its_status_and_queries_it() {
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
        // Forwarding: its workers may query this app, and only `get` it.
        let query: Vec<_> = rules
            .iter()
            .filter(|r| {
                r.resources
                    .iter()
                    .flatten()
                    .any(|x| x == "statefulstreamapps/query")
            })
            .collect();
        assert_eq!(query.len(), 1);
        assert_eq!(query[0].verbs, ["get"]);
        assert_eq!(
            query[0].resource_names.as_deref(),
            Some(&["pv".to_string()][..])
        );
    }
}
