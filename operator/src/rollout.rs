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
//! partitions stop until it has restored. When the tasks cannot be placed (the operator cannot
//! reach Kafka) nothing can be drained either: each pod restarts as soon as the one before is
//! up, as a StatefulSet's own rolling update would, so a fix of the Kafka settings still rolls.

use crate::placement::{self, DownCause, Health};

/// Annotation on the StatefulSet: the pod a rollout drains. A drain goes on until the pod
/// restarts, even when the pod restarted before falls behind meanwhile (each task moving to it
/// starts as a copy that lags): deciding afresh each time would move tasks to and fro.
pub const DRAINING: &str = "eddy.dev/rollout-draining";
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
    /// The revision (`controller-revision-hash`) of each of the app's pods that exists.
    /// None: the pods are not observed yet, nothing restarts.
    pub revisions: Option<&'a BTreeMap<String, String>>,
    /// The pods' health, as the assignor judges it (None: not observed, all up).
    pub health: Option<&'a BTreeMap<String, Health>>,
    /// The assignment the workers follow now (None: the tasks cannot be placed this time).
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
}

#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Nothing to roll: every pod runs the revision (or what they run is not known).
    Idle,
    /// `pod` runs the new template and is not done yet (`why`); the next pod waits.
    Settling { pod: String, why: String },
    /// `pod` runs the new template and is down: the rollout stops here.
    Halted { pod: String, cause: DownCause },
    /// `pod` is next. `drain`: its active tasks move to other pods first; false when no
    /// other pod is up to take them, or the tasks cannot be placed.
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
            Step::Next { pod, .. } | Step::Settling { pod, .. } => Some(pod),
            _ => None,
        }
    }

    /// Whether a rollout is under way (or halted).
    pub fn rolling(&self) -> bool {
        self.step != Step::Idle
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

    /// What the status says of the step, after [`Plan::summary`].
    pub fn message(&self, restart: bool, acceptable_lag: i64) -> String {
        let revision = self.revision.as_deref().unwrap_or("?");
        let step = match &self.step {
            Step::Idle => "every pod runs it".to_string(),
            Step::Settling { pod, why } => format!(
                "{pod} restarted; the next pod waits until {why} (acceptableRecoveryLag {acceptable_lag})"
            ),
            Step::Halted { pod, cause } => {
                format!("halted: {pod} runs the new template and is down ({cause})")
            }
            Step::Next { pod, .. } if restart => {
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
        return Plan {
            revision: input.update_revision.map(str::to_string),
            done: 0,
            total,
            step: Step::Idle,
        };
    };
    let health = |p: &str| match input.health {
        None => Health::Up,
        Some(h) => h.get(p).cloned().unwrap_or(Health::Down(DownCause::Gone)),
    };
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
        match settled(input, p, &health(p)) {
            Ok(()) => {}
            Err(step) => {
                // A halted pod says more than one still settling.
                let halted = matches!(step, Step::Halted { .. });
                if waiting.is_none() || halted {
                    waiting = Some(step);
                }
            }
        }
    }
    let plan = |step| Plan {
        revision: Some(revision.to_string()),
        done,
        total,
        step,
    };
    // Rolled out (or never rolled: the pods of a new app are created from the revision): a
    // pod restarting now is a failover's business, not the rollout's.
    if outdated.is_empty() && input.rolled_out.is_none_or(|r| r == revision) {
        return plan(Step::Idle);
    }
    // A drain under way goes on while the pod restarted before catches up ([`DRAINING`]).
    let catching_up =
        matches!(&waiting, Some(Step::Settling { pod, .. }) if health(pod) == Health::Up);
    if catching_up
        && let Some(pod) = input
            .draining
            .filter(|p| outdated.iter().any(|o| o == p) && health(p) == Health::Up)
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
    let others_up = pods.iter().any(|p| *p != pod && health(p).is_up());
    let drain = others_up && input.assignment.is_some();
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
    match health {
        Health::Up => {}
        Health::Starting => return settling("its worker reports"),
        Health::Stopping | Health::Down(DownCause::Gone | DownCause::Terminating) => {
            return settling("it is back and its worker reports");
        }
        Health::Down(cause) => {
            return Err(Step::Halted {
                pod: pod.to_string(),
                cause: cause.clone(),
            });
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
    let behind: Vec<String> = assigned
        .standby
        .iter()
        .chain(&assigned.warmup)
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

/// The pod to delete now, if any: the next pod once it holds no active task, in `assignment`
/// (the one this reconcile writes) and in its worker's own report, or at once when it is not
/// to be drained or is not up.
pub fn restart(
    plan: &Plan,
    assignment: Option<&Assignment>,
    reports: &BTreeMap<String, WorkerStatus>,
    health: Option<&BTreeMap<String, Health>>,
) -> Option<String> {
    let Step::Next { pod, drain } = &plan.step else {
        return None;
    };
    let up = health.is_none_or(|h| h.get(pod).is_some_and(Health::is_up));
    if !drain || !up {
        return Some(pod.clone());
    }
    let assigned = assignment
        .and_then(|a| a.pods.get(pod))
        .is_some_and(|t| !t.active.is_empty());
    let running = reports
        .get(pod)
        .is_some_and(|w| w.tasks.values().any(|t| t.role == TaskRole::Active));
    (!assigned && !running).then(|| pod.clone())
}

#[cfg(test)]
mod tests;
