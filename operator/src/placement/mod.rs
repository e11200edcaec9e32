//! The task assignor. librdkafka has no custom assignor and a consumer-group rebalance knows
//! nothing of where state lives, so the operator decides which pod runs which task — as
//! active, standby or warm-up — and writes it to `status.assignment`; workers follow it.
//!
//! [`place`] is a pure function of the app's tasks, the desired replicas, the pods' health,
//! the previous assignment and the workers' reports (role and lag of each copy of a task).
//! It moves state before it moves work:
//! - actives are balanced and sticky ([`active`]); a stateless task moves at once, a
//!   stateful one only once its new pod's copy lags by at most `acceptableRecoveryLag`:
//!   until then it stays and the new pod warms a copy up ([`warmup`]);
//! - standbys keep copies on other pods ([`standby`]);
//! - scale-in drains the leaving pods first (the StatefulSet keeps them until they are
//!   empty); a down pod ([`health`]) has its actives moved at once to the pod holding the
//!   most caught-up copy, else the least loaded, and is named in `assignment.down`.
//!
//! The generation increases only when the assignment changes; ties are broken by pod
//! ordinal, then name, so the result is deterministic.

pub mod active;
pub mod health;
pub mod sanitize;
pub mod standby;
pub mod warmup;

use eddy_crds::TaskId;
use eddy_crds::manifest::MAX_REPLICAS;
use eddy_crds::resource::{Assignment, PodTasks, TaskRole, WorkerStatus};
pub use health::{DownCause, Health, PodObserved};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Everything the assignor decides from.
#[derive(Clone, Debug)]
pub struct Input<'a> {
    /// The StatefulSet's name: pods are `<app>-<ordinal>`.
    pub app: &'a str,
    /// Partitions per sub-topology: the tasks.
    pub partitions: &'a [i32],
    /// Per sub-topology: whether its tasks have stores (stateless tasks move at once and
    /// get no standbys).
    pub stateful: &'a [bool],
    /// `spec.replicas`.
    pub replicas: i32,
    /// Health of the pods that matter ([`pods_to_watch`]); a pod missing from the map has no
    /// Pod object. None: not observed, every pod counts as up.
    pub health: Option<&'a BTreeMap<String, Health>>,
    pub previous: Option<&'a Assignment>,
    /// `status.workers`.
    pub reports: &'a BTreeMap<String, WorkerStatus>,
    /// `numStandbyReplicas`.
    pub standby_replicas: usize,
    /// `warmup.maxWarmupReplicas`.
    pub max_warmups: usize,
    /// `warmup.acceptableRecoveryLag`.
    pub acceptable_lag: i64,
    /// The `Progressing` reason of the last reconcile (a scale-out stays one until done).
    pub previous_reason: Option<Reason>,
    /// The pod a rolling update is about to restart ([`crate::rollout`]): its actives go to
    /// caught-up copies on other pods and it gets none, as a leaving pod's.
    pub draining: Option<&'a str>,
    /// The pod a rolling update restarts: its standbys and warm-ups stay assigned to it
    /// while it is away (its volume keeps their state, so it resumes them from a tail) instead
    /// of moving to pods that would restore them in full.
    pub restarting: Option<&'a str>,
}

/// What the assignor is doing, for the `Progressing` condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    Stable,
    /// New pods receive warm-ups of the tasks that will move to them.
    ScalingOut,
    /// Leaving pods hand their tasks over before the StatefulSet shrinks.
    Draining,
    /// Tasks wait for their new pod's copy to catch up (rebalancing).
    WarmingUp,
    /// A pod is down; its tasks were moved to the others.
    FailingOver,
    /// A changed pod template reaches the pods one at a time, each emptied of its active
    /// tasks before it restarts ([`crate::rollout`]; set by the reconcile, not by [`place`]).
    RollingUpdate,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Stable => "Stable",
            Reason::ScalingOut => "ScalingOut",
            Reason::Draining => "Draining",
            Reason::WarmingUp => "WarmingUp",
            Reason::FailingOver => "FailingOver",
            Reason::RollingUpdate => "RollingUpdate",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            Reason::Stable,
            Reason::ScalingOut,
            Reason::Draining,
            Reason::WarmingUp,
            Reason::FailingOver,
            Reason::RollingUpdate,
        ]
        .into_iter()
        .find(|r| r.as_str() == s)
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Progress {
    pub reason: Reason,
    pub message: String,
    /// What the status says whatever the reason (tasks short of standbys).
    pub note: Option<String>,
}

/// A task whose active changed pods in this step.
#[derive(Clone, Debug, PartialEq)]
pub struct Move {
    pub task: TaskId,
    pub from: String,
    pub to: String,
    pub why: Why,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Why {
    /// The new pod's copy lags by this many records, within `acceptableRecoveryLag`.
    CaughtUp { lag: i64 },
    /// No stores: nothing to warm up.
    Stateless,
    /// No worker of the app reports lags (workers older than warm-ups): moved at once, as
    /// before warm-ups existed.
    LagNotReported,
    /// The old pod is down; `lag` is what the new pod's copy lacked (None: it had none).
    Failover { cause: DownCause, lag: Option<i64> },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    pub assignment: Assignment,
    /// What the StatefulSet's replicas should be: `replicas`, or more while leaving pods
    /// still hold tasks.
    pub stateful_set_replicas: i32,
    pub progress: Progress,
    pub moves: Vec<Move>,
}

/// All tasks of an app: one per partition of each sub-topology's source.
pub fn tasks(partitions: &[i32]) -> Vec<TaskId> {
    partitions
        .iter()
        .enumerate()
        .flat_map(|(s, &n)| (0..n).map(move |p| TaskId::new(s as u32, p)))
        .collect()
}

pub fn pod_name(app: &str, ordinal: i32) -> String {
    format!("{app}-{ordinal}")
}

/// The pods whose health the assignor needs: the desired ones and every pod of the app the
/// previous assignment names.
pub fn pods_to_watch(app: &str, replicas: i32, previous: Option<&Assignment>) -> BTreeSet<String> {
    (0..replicas.clamp(0, MAX_REPLICAS))
        .map(|i| pod_name(app, i))
        .chain(
            previous
                .into_iter()
                .flat_map(|a| a.pods.keys().cloned().chain(a.down.iter().cloned())),
        )
        .filter(|p| sanitize::pod_ordinal(app, p).is_some())
        .collect()
}

/// The StatefulSet's replicas when no placement can be made this time (e.g. Kafka is
/// unreachable): never below a pod of the app the last assignment still gives actives, so a
/// drain in progress does not cut a pod off with its tasks. Only the app's own pod names
/// count (`<app>-<n>`, `n < MAX_REPLICAS`): the status they come from may have been written
/// by a worker, and a forged name must not scale the app (the caller also caps it at what
/// the StatefulSet has, see `reconcile::cap_replicas`).
pub fn hold_replicas(app: &str, replicas: i32, previous: Option<&Assignment>) -> i32 {
    if replicas <= 0 {
        return replicas.max(0);
    }
    let busy = previous
        .into_iter()
        .flat_map(|a| a.pods.iter())
        .filter(|(_, t)| !t.active.is_empty())
        .filter_map(|(p, _)| sanitize::pod_ordinal(app, p))
        .map(|o| o + 1)
        .max()
        .unwrap_or(0);
    replicas.min(MAX_REPLICAS).max(busy)
}

/// Whether no worker reports a lag at all: workers that predate warm-ups (a newer one reports
/// 0 for each running active). With them, tasks move at once as they always did.
pub fn lagless(reports: &BTreeMap<String, WorkerStatus>) -> bool {
    !reports
        .values()
        .flat_map(|w| w.tasks.values())
        .any(|t| t.lag.is_some())
}

/// `app-3` → 3, so `app-10` sorts after `app-9`.
pub(crate) fn ordinal(name: &str) -> u64 {
    name.rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(u64::MAX)
}

fn by_ordinal(p: &str) -> (u64, String) {
    (ordinal(p), p.to_string())
}

/// Decide the assignment. See the module docs. Whatever the previous assignment and the
/// reports say, only the app's own pods and tasks are considered ([`sanitize`]), and the
/// StatefulSet's replicas stay within `MAX_REPLICAS`.
pub fn place(input: &Input) -> Placement {
    let all = tasks(input.partitions);
    let known = sanitize::Tasks(Some(input.partitions));
    let previous = input
        .previous
        .map(|a| sanitize::assignment(input.app, known, a).assignment);
    let previous = previous.as_ref();
    let reports = sanitize::reports(input.app, known, input.reports);
    let floor = sanitize::applied_floor(&reports);
    let input = &Input {
        previous,
        reports: &reports,
        replicas: input.replicas.min(MAX_REPLICAS),
        ..input.clone()
    };
    let health = |p: &str| health::of(input.health, p);
    let up = |p: &str| health(p).is_up();
    let stateful = |t: TaskId| {
        input
            .stateful
            .get(t.subtopology as usize)
            .copied()
            .unwrap_or(true)
    };
    if input.replicas <= 0 {
        return Placement {
            assignment: next(
                previous,
                floor,
                input.partitions,
                BTreeMap::new(),
                Vec::new(),
            ),
            stateful_set_replicas: 0,
            progress: Progress {
                reason: Reason::Stable,
                message: "scaled to 0: no task runs".into(),
                note: None,
            },
            moves: Vec::new(),
        };
    }
    let replicas = u64::try_from(input.replicas).unwrap_or(0);
    let leaving = |p: &str| ordinal(p) >= replicas;
    let staying: Vec<String> = (0..input.replicas)
        .map(|i| pod_name(input.app, i))
        .filter(|p| up(p))
        .collect();
    // A pod the rollout drains, or whose worker hands its tasks over before it stops.
    let draining = |p: &str| input.draining == Some(p) || health(p) == Health::HandingOff;
    // The pods that may take active tasks: a pod the rollout drains takes none.
    let takers: Vec<String> = staying.iter().filter(|p| !draining(p)).cloned().collect();
    // The pods that may hold standbys: also the one the rollout restarts, while it is away.
    let holders: Vec<String> = (0..input.replicas)
        .map(|i| pod_name(input.app, i))
        .filter(|p| up(p) || input.restarting == Some(p.as_str()))
        .collect();
    // A pod handing its tasks over keeps the standbys it has, and gets no new one: copies
    // restored elsewhere right now would compete with the hand-off of its actives.
    let keepers: Vec<String> = (0..input.replicas)
        .map(|i| pod_name(input.app, i))
        .filter(|p| health(p) == Health::HandingOff)
        .collect();
    let legacy = lagless(input.reports);
    // Only a report of the pod's current container counts (Up): a restarted pod's previous
    // report still names the copies it had, which its new container (its volume lost, say)
    // may not have at all.
    let lag = |p: &str, t: TaskId| -> Option<i64> {
        if health(p) != Health::Up {
            return None;
        }
        input.reports.get(p)?.tasks.get(&t.to_string())?.lag
    };
    let acceptable = input.acceptable_lag;

    let exists: BTreeSet<TaskId> = all.iter().copied().collect();
    let mut prev_owner: BTreeMap<TaskId, String> = BTreeMap::new();
    let mut prev_standbys: BTreeMap<TaskId, Vec<String>> = BTreeMap::new();
    let mut prev_warmups: BTreeSet<(TaskId, String)> = BTreeSet::new();
    for (pod, t) in previous.iter().flat_map(|a| a.pods.iter()) {
        let ids = |l: &Vec<String>| -> Vec<TaskId> {
            l.iter()
                .filter_map(|id| id.parse().ok())
                .filter(|id| exists.contains(id))
                .collect()
        };
        for id in ids(&t.active) {
            prev_owner.insert(id, pod.clone());
        }
        for id in ids(&t.standby) {
            prev_standbys.entry(id).or_default().push(pod.clone());
        }
        for id in ids(&t.warmup) {
            prev_warmups.insert((id, pod.clone()));
        }
    }

    // Failover: the actives of a down pod go at once to the up pod holding the most
    // caught-up copy, else to the least loaded. With no pod to go to they stay.
    let mut owner: BTreeMap<TaskId, String> = BTreeMap::new();
    let mut failed = Vec::new();
    for t in &all {
        if let Some(o) = prev_owner.get(t) {
            match health(o) {
                Health::Down(cause) if !takers.is_empty() => failed.push((*t, o.clone(), cause)),
                _ => {
                    owner.insert(*t, o.clone());
                }
            }
        }
    }
    let mut down: BTreeSet<String> = previous
        .iter()
        .flat_map(|a| a.down.iter())
        // A pod leaves `down` once its current container has reported; one scaled away
        // for good is forgotten.
        .filter(|p| {
            health(p) != Health::Up && !(health(p) == Health::Down(DownCause::Gone) && leaving(p))
        })
        .cloned()
        .collect();
    let mut load: BTreeMap<String, usize> = takers.iter().map(|p| (p.clone(), 0)).collect();
    for o in owner.values() {
        if let Some(n) = load.get_mut(o) {
            *n += 1;
        }
    }
    let mut moves = Vec::new();
    for (t, from, cause) in failed {
        let to = takers
            .iter()
            .min_by_key(|p| {
                (
                    lag(p, t).unwrap_or(i64::MAX),
                    load.get(*p).copied().unwrap_or(0),
                    by_ordinal(p),
                )
            })
            .cloned();
        let Some(to) = to else { continue };
        *load.entry(to.clone()).or_default() += 1;
        owner.insert(t, to.clone());
        down.insert(from.clone());
        moves.push(Move {
            task: t,
            from,
            to: to.clone(),
            why: Why::Failover {
                cause,
                lag: lag(&to, t),
            },
        });
    }

    // Balance: every task's target; a task goes there now if it has no owner, is
    // stateless, or the target's copy has caught up; otherwise it waits (pending).
    let rank = |p: &str, t: TaskId| match lag(p, t) {
        Some(l) => l,
        None if prev_warmups.contains(&(t, p.to_string()))
            || prev_standbys
                .get(&t)
                .is_some_and(|s| s.iter().any(|x| x == p)) =>
        {
            i64::MAX - 1
        }
        None => i64::MAX,
    };
    let ideal = active::ideal(&all, &owner, &takers, rank);
    let mut pending: Vec<(TaskId, String)> = Vec::new();
    for t in &all {
        let Some(target) = ideal.get(t) else { continue };
        let Some(from) = owner.get(t).cloned() else {
            owner.insert(*t, target.clone());
            continue;
        };
        // A stopping pod's tasks wait for it to be gone: nothing else tells its new owner
        // when it has written its last.
        if from == *target || health(&from) == Health::Stopping {
            continue;
        }
        let why = if !stateful(*t) {
            Some(Why::Stateless)
        } else if legacy {
            Some(Why::LagNotReported)
        } else {
            lag(target, *t)
                .filter(|l| *l <= acceptable)
                .map(|lag| Why::CaughtUp { lag })
        };
        // A leaving or draining pod's task goes at once to any pod with a caught-up copy.
        let (to, why) = match why {
            Some(why) => (target.clone(), Some(why)),
            None if leaving(&from) || draining(&from) => takers
                .iter()
                .filter_map(|p| lag(p, *t).filter(|l| *l <= acceptable).map(|l| (p, l)))
                .min_by_key(|(p, l)| (*l, by_ordinal(p)))
                .map_or((target.clone(), None), |(p, lag)| {
                    (p.clone(), Some(Why::CaughtUp { lag }))
                }),
            None => (target.clone(), None),
        };
        match why {
            Some(why) => {
                owner.insert(*t, to.clone());
                moves.push(Move {
                    task: *t,
                    from,
                    to,
                    why,
                });
            }
            None => pending.push((*t, to)),
        }
    }

    let stateful_tasks: Vec<TaskId> = all.iter().copied().filter(|t| stateful(*t)).collect();
    let standbys = standby::place(
        &stateful_tasks,
        &owner,
        (&holders, &keepers),
        input.standby_replicas,
        &prev_standbys,
        lag,
    );
    let warmups = warmup::select(&pending, &standbys, &prev_warmups, input.max_warmups);
    // With fewer pods up than numStandbyReplicas + 1, as many standbys as fit (as Kafka
    // Streams does), said in the status.
    let short_standbys = stateful_tasks
        .iter()
        .filter(|t| standbys.get(t).map_or(0, Vec::len) < input.standby_replicas)
        .count();

    // The StatefulSet keeps a leaving pod until it holds no active, in the assignment and
    // in its own report (it has let its tasks go), or is down. One without a Pod object is
    // not kept: there is nothing to keep, and growing the StatefulSet for it would create a
    // pod that never had its tasks.
    let drained = |p: &str| {
        !owner.values().any(|o| o == p)
            && (!up(p)
                || !input
                    .reports
                    .get(p)
                    .is_some_and(|w| w.tasks.values().any(|t| t.role == TaskRole::Active)))
    };
    let busiest_leaving = previous
        .iter()
        .flat_map(|a| a.pods.keys())
        .chain(owner.values())
        .filter(|p| leaving(p) && !drained(p) && health(p) != Health::Down(DownCause::Gone))
        .filter_map(|p| sanitize::pod_ordinal(input.app, p))
        .max();
    let sts = busiest_leaving.map_or(input.replicas, |o| input.replicas.max(o + 1));

    let mut pods: BTreeMap<String, PodTasks> = (0..sts)
        .map(|i| (pod_name(input.app, i), PodTasks::default()))
        .collect();
    for (t, p) in &owner {
        pods.entry(p.clone())
            .or_default()
            .active
            .push(t.to_string());
    }
    for (t, ps) in &standbys {
        for p in ps {
            pods.entry(p.clone())
                .or_default()
                .standby
                .push(t.to_string());
        }
    }
    for (t, p) in &warmups {
        pods.entry(p.clone())
            .or_default()
            .warmup
            .push(t.to_string());
    }
    // Each entry names the worker run it was made for: one the operator has seen report.
    for (p, t) in pods.iter_mut() {
        if health(p) == Health::Up {
            t.incarnation = input.reports.get(p).and_then(|w| w.incarnation.clone());
        }
    }
    for t in pods.values_mut() {
        for l in [&mut t.active, &mut t.standby, &mut t.warmup] {
            l.sort_by_key(|id| id.parse::<TaskId>().ok());
        }
    }

    let progress = progress(
        input,
        &ProgressFacts {
            down: &down,
            health: &health,
            sts,
            owner: &owner,
            pending: &pending,
            standbys: &standbys,
            warmups: &warmups,
            lag: &lag,
            short_standbys,
            up: staying.len(),
        },
    );
    let down: Vec<String> = {
        let mut d: Vec<String> = down.into_iter().collect();
        d.sort_by_key(|p| by_ordinal(p));
        d
    };
    Placement {
        assignment: next(previous, floor, input.partitions, pods, down),
        stateful_set_replicas: sts,
        progress,
        moves,
    }
}

struct ProgressFacts<'a> {
    down: &'a BTreeSet<String>,
    health: &'a dyn Fn(&str) -> Health,
    sts: i32,
    owner: &'a BTreeMap<TaskId, String>,
    pending: &'a [(TaskId, String)],
    standbys: &'a BTreeMap<TaskId, Vec<String>>,
    warmups: &'a [(TaskId, String)],
    lag: &'a dyn Fn(&str, TaskId) -> Option<i64>,
    /// Stateful tasks with fewer standbys than `numStandbyReplicas`.
    short_standbys: usize,
    /// Staying pods that are up.
    up: usize,
}

fn progress(input: &Input, f: &ProgressFacts) -> Progress {
    let note = (f.short_standbys > 0).then(|| {
        format!(
            "{} tasks have fewer standbys than numStandbyReplicas {}: {} pods are up, and a standby never shares its active's pod",
            f.short_standbys, input.standby_replicas, f.up
        )
    });
    let (reason, message) = progress_of(input, f);
    Progress {
        reason,
        message,
        note,
    }
}

fn progress_of(input: &Input, f: &ProgressFacts) -> (Reason, String) {
    let warming = || {
        let copies: Vec<String> = f
            .pending
            .iter()
            .filter(|(t, p)| {
                f.warmups.iter().any(|(w, q)| w == t && q == p)
                    || f.standbys.get(t).is_some_and(|s| s.contains(p))
            })
            .map(|(t, p)| match (f.lag)(p, *t) {
                Some(l) => format!("{t} to {p} (lag {l})"),
                None => format!("{t} to {p} (no lag reported yet)"),
            })
            .collect();
        let waiting = f.pending.len() - copies.len();
        let mut m = format!(
            "{} task(s) move once their new pod's copy lags by at most {} records",
            f.pending.len(),
            input.acceptable_lag
        );
        if !copies.is_empty() {
            m.push_str(&format!(": warming up {}", copies.join(", ")));
        }
        if waiting > 0 {
            m.push_str(&format!(
                "; {waiting} wait for a warm-up slot (maxWarmupReplicas {})",
                input.max_warmups
            ));
        }
        m
    };
    if !f.down.is_empty() {
        let pods: Vec<String> = f
            .down
            .iter()
            .map(|p| match (f.health)(p) {
                Health::Down(cause) => format!("{p} is down ({cause})"),
                Health::Up | Health::Starting | Health::Stopping | Health::HandingOff => {
                    format!("{p} is back, waiting for its first report")
                }
            })
            .collect();
        return (
            Reason::FailingOver,
            format!(
                "{}: its tasks run on the other pods; it gets tasks again once it reports",
                pods.join("; ")
            ),
        );
    }
    if f.sts > input.replicas {
        let holding: BTreeSet<&String> = f
            .owner
            .values()
            .filter(|p| ordinal(p) >= u64::try_from(input.replicas).unwrap_or(0))
            .collect();
        let mut message = format!(
            "scaling in to {} replicas: the StatefulSet keeps {} until the leaving pods hand their tasks over",
            input.replicas, f.sts
        );
        if holding.is_empty() {
            message.push_str("; waiting for them to report their tasks released");
        } else {
            let names: Vec<&str> = holding.iter().map(|p| p.as_str()).collect();
            message.push_str(&format!("; {} still run tasks", names.join(", ")));
        }
        if !f.pending.is_empty() {
            message.push_str(&format!("; {}", warming()));
        }
        return (Reason::Draining, message);
    }
    let stopping: BTreeSet<&String> = f
        .owner
        .values()
        .filter(|p| (f.health)(p) == Health::HandingOff)
        .collect();
    if !stopping.is_empty() {
        let names: Vec<&str> = stopping.iter().map(|p| p.as_str()).collect();
        let mut message = format!(
            "{} stopping (deleted or evicted): their active tasks move to caught-up copies on the other pods before they go",
            names.join(", ")
        );
        if !f.pending.is_empty() {
            message.push_str(&format!("; {}", warming()));
        }
        return (Reason::Draining, message);
    }
    if !f.pending.is_empty() {
        let grew = input
            .previous
            .is_some_and(|a| a.pods.len() < usize::try_from(input.replicas).unwrap_or(0));
        let reason = if grew || input.previous_reason == Some(Reason::ScalingOut) {
            Reason::ScalingOut
        } else {
            Reason::WarmingUp
        };
        return (reason, warming());
    }
    (Reason::Stable, "every task is where it belongs".into())
}

/// The assignment with its generation: the previous one's if nothing changed, else the
/// next. Without a previous generation the operator can have written (none, or a forged one
/// beyond [`sanitize::MAX_GENERATION`]), it starts above `floor`, the highest generation a
/// worker reports it applied: workers take only a newer generation than theirs.
fn next(
    previous: Option<&Assignment>,
    floor: i64,
    partitions: &[i32],
    pods: BTreeMap<String, PodTasks>,
    down: Vec<String>,
) -> Assignment {
    let generation = match previous.filter(|p| sanitize::sane_generation(p.generation)) {
        Some(p) if p.pods == pods && p.partitions == partitions && p.down == down => p.generation,
        Some(p) => p.generation.saturating_add(1),
        None => floor.saturating_add(1),
    };
    Assignment {
        generation,
        partitions: partitions.to_vec(),
        pods,
        down,
    }
}

/// The moves of one step as event messages, one per batch (same new pod, same cause).
pub fn describe_moves(moves: &[Move], acceptable_lag: i64) -> Vec<(String, String)> {
    let mut batches: BTreeMap<(String, u8), Vec<&Move>> = BTreeMap::new();
    for m in moves {
        let kind = match m.why {
            Why::Failover { .. } => 0,
            Why::CaughtUp { .. } => 1,
            Why::Stateless => 2,
            Why::LagNotReported => 3,
        };
        batches.entry((m.to.clone(), kind)).or_default().push(m);
    }
    batches
        .into_iter()
        .map(|((to, kind), ms)| {
            let ids: Vec<String> = ms.iter().map(|m| m.task.to_string()).collect();
            let ids = ids.join(", ");
            match kind {
                0 => {
                    let from: BTreeSet<String> = ms
                        .iter()
                        .map(|m| match &m.why {
                            Why::Failover { cause, .. } => format!("{} ({cause})", m.from),
                            _ => m.from.clone(),
                        })
                        .collect();
                    let lags: Vec<String> = ms
                        .iter()
                        .map(|m| match m.why {
                            Why::Failover { lag: Some(l), .. } => format!("{} lag {l}", m.task),
                            _ => format!("{} restores in full", m.task),
                        })
                        .collect();
                    (
                        "TasksFailedOver".to_string(),
                        format!(
                            "moved {ids} to {to}: {} down; {}",
                            from.into_iter().collect::<Vec<_>>().join(", "),
                            lags.join(", ")
                        ),
                    )
                }
                1 => {
                    let lags: Vec<String> = ms
                        .iter()
                        .map(|m| match m.why {
                            Why::CaughtUp { lag } => lag.to_string(),
                            _ => String::new(),
                        })
                        .collect();
                    (
                        "TasksMoved".to_string(),
                        format!(
                            "moved {ids} to {to}: caught up (lag {} ≤ {acceptable_lag})",
                            lags.join(", ")
                        ),
                    )
                }
                2 => (
                    "TasksMoved".to_string(),
                    format!("moved {ids} to {to}: stateless, nothing to warm up"),
                ),
                _ => (
                    "TasksMoved".to_string(),
                    format!("moved {ids} to {to}: the workers report no lag, so no warm-up"),
                ),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
