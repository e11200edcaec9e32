//! Rolling updates that move state first. The worker StatefulSet updates `OnDelete`: its
//! controller never restarts a pod for a new template; the operator does, one pod at a time:
//! 1. the next pod (a down one first, else the highest ordinal, as the StatefulSet would)
//!    is drained: the assignor moves its active tasks to caught-up copies on other pods
//!    ([`crate::placement::Input::draining`]) while it keeps running them;
//! 2. once it holds no active task, in the assignment and in its worker's report, the
//!    operator deletes it and the StatefulSet recreates it from the new template on the same
//!    volume; it keeps its standbys and warm-ups while away
//!    ([`crate::placement::Input::restarting`]);
//! 3. it is done once its new worker reports every active running and every copy within
//!    `acceptableRecoveryLag`; only then is the next pod taken.
//!
//! Readiness plays no part: a pod is done when its copies caught up, whatever its probe says.
//! A restarted pod that does not come back (down for any cause but its restart) halts the
//! rollout: the other pods keep the old template and the app is Degraded (`RolloutHalted`).
//! A further change during a rollout is a new revision: a pod restarted for the old one is
//! outdated again and the rollout goes on with the new one, one pod at a time.
//!
//! With no other pod up to take the tasks (one replica), the pod restarts with them: their
//! partitions stop until it has restored. When the tasks cannot be placed this time (the
//! operator cannot reach Kafka, a source topic is missing) nothing restarts: the rollout waits.
//! Pods are restarted by eviction, so the PodDisruptionBudget holds a restart back while
//! another pod of the app is disrupted (a node drain, say).

use crate::placement::{self, DownCause, Health};

/// Annotation on the StatefulSet: the pod a rollout drains. A drain goes on until the pod
/// restarts, even when the pod restarted before falls behind meanwhile (each task moving to it
/// starts as a copy that lags): deciding afresh each time would move tasks to and fro.
pub const DRAINING: &str = "eddy.dev/rollout-draining";

/// Annotation on the StatefulSet: the pod the rollout last restarted and when
/// (`<pod>@<RFC 3339 time>`), so a pod that does not come back halts the rollout.
pub const RESTARTED: &str = "eddy.dev/rollout-restarted";

/// How long a restarted pod may take to be back (recreated and reporting) before the rollout
/// halts: the time to pull an image and start, with room.
pub const BACK_WITHIN_SECONDS: u64 = 300;
use eddy_crds::resource::{Assignment, TaskRole, TaskState, WorkerStatus};
use std::collections::BTreeMap;

/// Everything a rollout step is decided from.
#[derive(Clone, Debug)]
pub struct Input<'a> {
    pub app: &'a str,
    /// `spec.replicas`: pods `0..replicas` are rolled (a leaving pod goes away instead).
    pub replicas: i32,
    /// The revision every pod should run: the StatefulSet's `updateRevision`, once its
    /// controller has seen the current template. None: not known yet, nothing restarts.
    pub update_revision: Option<&'a str>,
    /// The revision last seen rolled out to every pod (the StatefulSet's annotation).
    pub rolled_out: Option<&'a str>,
    /// The pod the last step drained ([`Plan::draining`], kept in the StatefulSet's
    /// annotation [`DRAINING`]).
    pub draining: Option<&'a str>,
    /// The pod the rollout last restarted and how many seconds ago ([`RESTARTED`]).
    pub restarted: Option<(&'a str, u64)>,
    /// The revision (`controller-revision-hash`) of each of the app's pods that exists.
    /// None: the pods are not observed yet, nothing restarts.
    pub revisions: Option<&'a BTreeMap<String, String>>,
    /// The pods' health, as the assignor judges it (None: not observed, all up).
    pub health: Option<&'a BTreeMap<String, Health>>,
    /// The assignment the workers follow now (None: the tasks cannot be placed this time:
    /// the plan is shown, nothing restarts).
    pub assignment: Option<&'a Assignment>,
    /// `status.workers`, sanitized.
    pub reports: &'a BTreeMap<String, WorkerStatus>,
    /// `warmup.acceptableRecoveryLag`.
    pub acceptable_lag: i64,
}

/// Where the rollout stands.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The revision rolled out (None: unknown).
    pub revision: Option<String>,
    /// Pods running it that are back and reporting, of `total`.
    pub done: usize,
    pub total: usize,
    pub step: Step,
    /// Whether the step may restart a pod: the revisions, the pods and the tasks are known.
    pub may_restart: bool,
    /// The pod the rollout restarted ([`Input::restarted`]) while it is not back (not up, or
    /// not known to be): its [`RESTARTED`] time is kept.
    pub away: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Nothing to roll: every pod runs the revision (or what they run is not known).
    Idle,
    /// `pod` runs the new template and is not done yet (`why`); the next pod waits.
    Settling { pod: String, why: String },
    /// Something else goes first (`why`): leaving pods drain, the tasks cannot be placed.
    Waiting { why: String },
    /// `pod` runs the new template and is down (`why`): the rollout stops here. `starting`:
    /// it has not run yet (a slow pull, say), so it keeps its copies.
    Halted {
        pod: String,
        why: String,
        starting: bool,
    },
    /// `pod` is next. `drain`: its active tasks move to other pods first; false when no
    /// other pod is up to take them.
    Next { pod: String, drain: bool },
}

impl Plan {
    /// The pod whose active tasks the assignor moves away.
    pub fn draining(&self) -> Option<&str> {
        match &self.step {
            Step::Next { pod, drain: true } => Some(pod),
            _ => None,
        }
    }

    /// The pod the rollout restarts (or just restarted): its copies stay assigned to it.
    pub fn restarting(&self) -> Option<&str> {
        match &self.step {
            Step::Next { pod, .. }
            | Step::Settling { pod, .. }
            | Step::Halted {
                pod,
                starting: true,
                ..
            } => Some(pod),
            _ => None,
        }
    }

    /// Whether a rollout is under way (or halted).
    pub fn rolling(&self) -> bool {
        self.step != Step::Idle
    }

    pub fn halted(&self) -> bool {
        matches!(self.step, Step::Halted { .. })
    }

    /// The revision, once every pod runs it and is done.
    pub fn complete(&self) -> Option<&str> {
        (self.step == Step::Idle && self.total > 0 && self.done == self.total)
            .then_some(self.revision.as_deref())
            .flatten()
    }

    /// `RollingUpdate 1/3`, for `kubectl get`.
    pub fn summary(&self) -> String {
        format!("RollingUpdate {}/{}", self.done, self.total)
    }

    /// What the status says of the step, after [`Plan::summary`]. `restart`: the pod of a
    /// [`Step::Next`] is restarted now.
    pub fn message(&self, restart: bool, acceptable_lag: i64) -> String {
        let revision = self.revision.as_deref().unwrap_or("?");
        let step = match &self.step {
            Step::Idle => "every pod runs it".to_string(),
            Step::Settling { pod, why } => format!(
                "{pod} restarted; the next pod waits until {why} (acceptableRecoveryLag {acceptable_lag})"
            ),
            Step::Waiting { why } => format!("waiting: {why}"),
            Step::Halted { pod, why, .. } => format!("halted at {pod}: {why}"),
            Step::Next { pod, drain: true } if restart => {
                format!("restarting {pod}, which holds no active task now")
            }
            Step::Next { pod, drain: true } => format!(
                "moving {pod}'s active tasks to caught-up copies on other pods before it restarts"
            ),
            Step::Next { pod, drain: false } => {
                format!("restarting {pod} with its tasks: no other pod can take them")
            }
        };
        format!("{} to revision {revision}: {step}", self.summary())
    }
}

/// Where the rollout stands and what it does next, from the assignment the workers follow
/// now (before this reconcile places tasks). See the module docs.
pub fn plan(input: &Input) -> Plan {
    let total = usize::try_from(input.replicas.max(0)).unwrap_or(0);
    let (Some(revision), Some(revisions)) = (input.update_revision, input.revisions) else {
        // Not known (the pod cache syncing, the StatefulSet controller behind): a drain under
        // way is kept, so its pod gets no task back meanwhile; nothing restarts.
        return Plan {
            revision: input.update_revision.map(str::to_string),
            done: 0,
            total,
            step: input.draining.map_or(Step::Idle, |pod| Step::Next {
                pod: pod.to_string(),
                drain: true,
            }),
            may_restart: false,
            away: input.restarted.map(|(p, _)| p.to_string()),
        };
    };
    let health = |p: &str| placement::health::of(input.health, p);
    let pods: Vec<String> = (0..input.replicas.max(0))
        .map(|i| placement::pod_name(input.app, i))
        .collect();
    let outdated: Vec<&String> = pods
        .iter()
        .filter(|p| revisions.get(*p).is_some_and(|r| r != revision))
        .collect();
    // Each pod running the revision (or about to: a missing pod is created from it) and
    // whether it is done.
    let mut done = 0;
    let mut waiting: Option<Step> = None;
    for p in pods.iter().filter(|p| !outdated.contains(p)) {
        // Counted once back and reporting: its copies falling behind again as tasks move to
        // it holds the next pod, but does not count it undone.
        if health(p) == Health::Up {
            done += 1;
        }
        if let Err(step) = settled(input, p, &health(p)) {
            // A halted pod says more than one still settling.
            let halted = matches!(step, Step::Halted { .. });
            if waiting.is_none() || halted {
                waiting = Some(step);
            }
        }
    }
    let away = input
        .restarted
        .map(|(p, _)| p)
        .filter(|p| health(p) != Health::Up)
        .map(str::to_string);
    let plan = |step| Plan {
        revision: Some(revision.to_string()),
        done,
        total,
        step,
        may_restart: input.assignment.is_some(),
        away: away.clone(),
    };
    // Rolled out (or never rolled: the pods of a new app are created from the revision): a
    // pod restarting now is a failover's business, not the rollout's.
    if outdated.is_empty() && input.rolled_out.is_none_or(|r| r == revision) {
        return plan(Step::Idle);
    }
    let Some(assignment) = input.assignment else {
        return plan(waiting.unwrap_or(Step::Waiting {
            why: "the tasks cannot be placed now (see the Degraded condition), so no pod can be emptied".into(),
        }));
    };
    // A scale-in first: its leaving pods hand their tasks to the pods that stay.
    let leaving = assignment
        .pods
        .iter()
        .filter(|(p, t)| {
            !t.active.is_empty()
                && placement::sanitize::pod_ordinal(input.app, p)
                    .is_some_and(|o| o >= input.replicas)
        })
        .count();
    if leaving > 0 {
        return plan(Step::Waiting {
            why: format!("{leaving} leaving pod(s) hand their tasks over first"),
        });
    }
    // A drain under way goes on while the pod restarted before catches up ([`DRAINING`]),
    // as long as no other pod is away.
    let catching_up =
        matches!(&waiting, Some(Step::Settling { pod, .. }) if health(pod) == Health::Up);
    if catching_up
        && let Some(pod) = input.draining.filter(|p| {
            outdated.iter().any(|o| o == p) && pods.iter().all(|q| health(q) == Health::Up)
        })
    {
        return plan(Step::Next {
            pod: pod.to_string(),
            drain: true,
        });
    }
    if let Some(step) = waiting {
        return plan(step);
    }
    // The next pod: a down one first (it serves nothing), else the highest ordinal.
    let next = outdated
        .iter()
        .max_by_key(|p| (!health(p).is_up(), placement::ordinal(p)))
        .map(|p| p.to_string());
    let Some(pod) = next else {
        return plan(Step::Idle);
    };
    let drain = pods.iter().any(|p| *p != pod && health(p).is_up());
    plan(Step::Next { pod, drain })
}

/// Whether a pod running the new revision is done: its current container reported every
/// active running and every copy within the acceptable lag. Else the step that waits for it.
fn settled(input: &Input, pod: &str, health: &Health) -> Result<(), Step> {
    let settling = |why: &str| {
        Err(Step::Settling {
            pod: pod.to_string(),
            why: why.to_string(),
        })
    };
    let halted = |why: String, starting: bool| {
        Err(Step::Halted {
            pod: pod.to_string(),
            why,
            starting,
        })
    };
    // A pod the rollout restarted that is still not back after the bound halts it.
    let away = input
        .restarted
        .filter(|(p, secs)| *p == pod && *secs > BACK_WITHIN_SECONDS)
        .map(|(_, secs)| secs);
    match health {
        Health::Up => {}
        Health::Starting => return settling("its worker reports"),
        Health::Stopping
        | Health::HandingOff
        | Health::Down(DownCause::Gone | DownCause::Terminating) => {
            if let Some(secs) = away {
                let state = match health {
                    Health::Down(cause) => cause.to_string(),
                    _ => "its pod is stopping".to_string(),
                };
                return halted(
                    format!(
                        "restarted {secs}s ago, it is not back ({state}); the StatefulSet's events (kubectl describe statefulset) say why it is not recreated"
                    ),
                    false,
                );
            }
            return settling("it is back and its worker reports");
        }
        Health::Down(cause @ DownCause::NotStarted(_)) => {
            return halted(
                format!("it runs the new pod template and is down ({cause})"),
                true,
            );
        }
        Health::Down(cause) => {
            return halted(
                format!("it runs the new pod template and is down ({cause})"),
                false,
            );
        }
    }
    let Some(assigned) = input.assignment.and_then(|a| a.pods.get(pod)) else {
        return Ok(());
    };
    let report = input.reports.get(pod);
    let task = |id: &String| report.and_then(|w| w.tasks.get(id));
    let not_running: Vec<&String> = assigned
        .active
        .iter()
        .filter(|id| {
            !task(id).is_some_and(|t| t.role == TaskRole::Active && t.state == TaskState::Running)
        })
        .collect();
    // Lag-less workers: copies are not waited for, as the assignor moves their tasks at once.
    let legacy = placement::lagless(input.reports);
    let behind: Vec<String> = assigned
        .standby
        .iter()
        .chain(&assigned.warmup)
        .filter(|_| !legacy)
        .filter_map(|id| match task(id).and_then(|t| t.lag) {
            Some(l) if (0..=input.acceptable_lag).contains(&l) => None,
            Some(l) => Some(format!("{id} lag {l}")),
            None => Some(format!("{id} no lag yet")),
        })
        .collect();
    if not_running.is_empty() && behind.is_empty() {
        return Ok(());
    }
    let mut why = Vec::new();
    if !not_running.is_empty() {
        let ids: Vec<&str> = not_running.iter().map(|s| s.as_str()).collect();
        why.push(format!("its active tasks run ({} not yet)", ids.join(", ")));
    }
    if !behind.is_empty() {
        why.push(format!("its copies catch up ({})", behind.join(", ")));
    }
    settling(&why.join(" and "))
}

/// The pod to restart now, if any: the next pod once it holds no active task, in `assignment`
/// (the one this reconcile writes) and in the report of its worker, which applied that
/// assignment; or at once when it is not to be drained, or is down (but not already
/// terminating or gone).
pub fn restart(
    plan: &Plan,
    assignment: Option<&Assignment>,
    reports: &BTreeMap<String, WorkerStatus>,
    health: Option<&BTreeMap<String, Health>>,
) -> Option<String> {
    let Step::Next { pod, drain } = &plan.step else {
        return None;
    };
    let assignment = assignment.filter(|_| plan.may_restart)?;
    match placement::health::of(health, pod) {
        // Already going, or gone: nothing to evict.
        Health::Stopping
        | Health::HandingOff
        | Health::Down(DownCause::Terminating | DownCause::Gone) => {
            return None;
        }
        Health::Down(_) => return Some(pod.clone()),
        Health::Up | Health::Starting if !drain => return Some(pod.clone()),
        Health::Up | Health::Starting => {}
    }
    let assigned = assignment
        .pods
        .get(pod)
        .is_some_and(|t| !t.active.is_empty());
    let released = reports.get(pod).is_some_and(|w| {
        w.applied_generation == assignment.generation
            && !w.tasks.values().any(|t| t.role == TaskRole::Active)
    });
    (!assigned && released).then(|| pod.clone())
}

/// The [`RESTARTED`] annotation to write: the pod restarted now (keeping the time already
/// recorded for it, so a refused eviction or a slow termination does not push it on), or the
/// one recorded while it is not back; else none.
pub fn restarted_annotation(
    plan: &Plan,
    restart: Option<&str>,
    recorded: Option<(&str, &str)>,
    now: &str,
) -> Option<String> {
    match (restart, recorded) {
        (Some(pod), Some((was, at))) if pod == was => Some(format!("{pod}@{at}")),
        (Some(pod), _) => Some(format!("{pod}@{now}")),
        (None, Some((was, at))) if plan.away.as_deref() == Some(was) => Some(format!("{was}@{at}")),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
