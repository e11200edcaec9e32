//! What a worker should hold and what to do when that changes, as pure functions: the
//! operator's assignment for this pod ([`Desired`]), the per-task moves a new generation
//! makes ([`Changes`]), who still holds a task being handed over ([`holders`]), and how far
//! behind a copy of a store is ([`lag`]).

use eddy_crds::TaskId;
use eddy_crds::resource::{Assignment, TaskRole};
use std::collections::HashMap;

/// The operator's assignment for this pod (`status.assignment`), or, standalone, every task
/// active here.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Desired {
    pub generation: i64,
    /// Tasks this worker processes.
    pub active: Vec<TaskId>,
    /// Tasks whose stores this worker keeps up to date from their changelogs.
    pub standby: Vec<TaskId>,
    /// Standbys placed here because the task is about to move here.
    pub warmup: Vec<TaskId>,
    /// Pods the operator failed over: their tasks are taken without waiting for them.
    pub down: Vec<String>,
    /// Every pod of the assignment, this one included.
    pub pods: Vec<String>,
}

impl Desired {
    /// What `assignment` gives `pod`, whose worker run is `incarnation`. An entry made for
    /// another run (the previous one, before a restart, or none yet) gives nothing: the
    /// operator may be failing that run's tasks over while it decides, so this run waits
    /// for an entry naming it (made once the operator has seen it report).
    pub fn from_assignment(assignment: &Assignment, pod: &str, incarnation: &str) -> Desired {
        let ids =
            |v: &[String]| -> Vec<TaskId> { v.iter().filter_map(|t| t.parse().ok()).collect() };
        let mine = assignment
            .pods
            .get(pod)
            .filter(|p| p.incarnation.as_deref() == Some(incarnation));
        Desired {
            generation: assignment.generation,
            active: mine.map(|p| ids(&p.active)).unwrap_or_default(),
            standby: mine.map(|p| ids(&p.standby)).unwrap_or_default(),
            warmup: mine.map(|p| ids(&p.warmup)).unwrap_or_default(),
            down: assignment.down.clone(),
            pods: assignment.pods.keys().cloned().collect(),
        }
    }

    /// The standby and warm-up tasks, with their role. A task listed as active is active
    /// only; one listed as both standby and warm-up is a warm-up.
    pub fn replicas(&self) -> Vec<(TaskId, TaskRole)> {
        let mut out: Vec<(TaskId, TaskRole)> = Vec::new();
        for (ids, role) in [
            (&self.warmup, TaskRole::Warmup),
            (&self.standby, TaskRole::Standby),
        ] {
            for id in ids {
                if !self.active.contains(id) && !out.iter().any(|(t, _)| t == id) {
                    out.push((*id, role));
                }
            }
        }
        out.sort();
        out
    }

    /// Only the tasks `known` has (the app's tasks): the rest are returned apart.
    pub fn retain_known(&mut self, known: &[TaskId]) -> Vec<TaskId> {
        let mut unknown = Vec::new();
        for ids in [&mut self.active, &mut self.standby, &mut self.warmup] {
            ids.retain(|t| {
                let ok = known.contains(t);
                if !ok {
                    unknown.push(*t);
                }
                ok
            });
        }
        unknown
    }
}

/// What a new generation does to each task of this worker.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Active here now, and not a replica here before: restored from whatever local state
    /// the worker has.
    pub start: Vec<TaskId>,
    /// A standby or warm-up here becomes active: the replica's stores are handed over at
    /// their position and only the tail is restored.
    pub promote: Vec<TaskId>,
    /// Active here, now a standby or warm-up here: committed, closed, its stores kept and
    /// followed from their changelogs.
    pub demote: Vec<TaskId>,
    /// Active here, not here at all any more: committed and closed (its state stays on disk).
    pub release: Vec<TaskId>,
    /// The standbys and warm-ups to follow after the change, with their role.
    pub replicas: Vec<(TaskId, TaskRole)>,
}

impl Changes {
    /// Nothing to do for the active tasks (the replicas may still change).
    pub fn actives_unchanged(&self) -> bool {
        self.start.is_empty()
            && self.promote.is_empty()
            && self.demote.is_empty()
            && self.release.is_empty()
    }

    /// Tasks that become active here.
    pub fn gained(&self) -> Vec<TaskId> {
        let mut v: Vec<TaskId> = self.start.iter().chain(&self.promote).copied().collect();
        v.sort();
        v
    }

    /// Active tasks that stop being active here.
    pub fn lost(&self) -> Vec<TaskId> {
        let mut v: Vec<TaskId> = self.demote.iter().chain(&self.release).copied().collect();
        v.sort();
        v
    }
}

/// The moves from what this worker holds (`active`, `replicas`) to `desired`.
pub fn changes(active: &[TaskId], replicas: &[TaskId], desired: &Desired) -> Changes {
    let next = desired.replicas();
    let is_replica = |t: &TaskId| next.iter().any(|(r, _)| r == t);
    let mut c = Changes {
        replicas: next.clone(),
        ..Default::default()
    };
    for t in &desired.active {
        if active.contains(t) {
            continue;
        }
        if replicas.contains(t) {
            c.promote.push(*t);
        } else {
            c.start.push(*t);
        }
    }
    for t in active {
        if desired.active.contains(t) {
            continue;
        }
        if is_replica(t) {
            c.demote.push(*t);
        } else {
            c.release.push(*t);
        }
    }
    for v in [&mut c.start, &mut c.promote, &mut c.demote, &mut c.release] {
        v.sort();
        v.dedup();
    }
    c
}

/// Another worker of the same app, as its `status.workers` entry describes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Peer {
    pub applied_generation: i64,
    /// Tasks it reports with role ACTIVE, in any state.
    pub active: Vec<TaskId>,
    /// It hands its tasks over before it stops and takes no new one: it holds at most what
    /// it reports active, whatever generation it applied.
    pub stopping: bool,
}

/// The peers to wait for before taking `ids`, gained in `generation`: those (outside `down`)
/// that report one of them ACTIVE, and those of the assignment's `pods` that have not applied
/// `generation` yet. A report lags behind its worker: one that took a task in the previous
/// generation may not show it yet, and taking the task from under it would have two workers
/// process it at once (under at-least-once, the later changelog writes of the one that lost
/// it would overwrite the newer state). Applying a generation lets go of the tasks it moved
/// away before it is reported, and before any restore, so workers gaining tasks at once do
/// not wait on each other's restores.
pub fn holders(
    peers: &HashMap<String, Peer>,
    ids: &[TaskId],
    down: &[String],
    generation: i64,
    pods: &[String],
) -> Vec<String> {
    let mut v: Vec<String> = peers
        .iter()
        .filter(|(pod, p)| {
            !down.contains(pod)
                && (p.active.iter().any(|t| ids.contains(t))
                    || (pods.contains(pod) && p.applied_generation < generation && !p.stopping))
        })
        .map(|(pod, _)| pod.clone())
        .collect();
    v.sort();
    v
}

/// The failed-over pods (`down`, other than `me`) to fence before taking `gained` in
/// `generation`: all of them, except one that has applied this generation (which lists it as
/// down, so it knows) and reports none of `gained` ACTIVE. That one came back, or let go, and
/// holds no transaction of those tasks: fencing its transactional id would only abort the new
/// incarnation's work. A pod whose last report predates the generation may have died holding
/// a task before reporting it, with a transaction open: it is fenced.
pub fn to_fence(
    peers: &HashMap<String, Peer>,
    gained: &[TaskId],
    down: &[String],
    generation: i64,
    me: &str,
) -> Vec<String> {
    let mut v: Vec<String> = down
        .iter()
        .filter(|pod| *pod != me)
        .filter(|pod| {
            !peers.get(*pod).is_some_and(|p| {
                p.applied_generation >= generation && !p.active.iter().any(|t| gained.contains(t))
            })
        })
        .cloned()
        .collect();
    v.sort();
    v.dedup();
    v
}

/// Changelog records a copy of a store lacks: from `position` (the next offset it would
/// apply) to the changelog's end (its last stable offset under read_committed). Unknown ends
/// count as caught up only once the copy reached them.
pub fn lag(position: i64, end: Option<i64>) -> Option<i64> {
    end.map(|e| (e - position).max(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[i32]) -> Vec<TaskId> {
        v.iter().map(|p| TaskId::new(0, *p)).collect()
    }

    #[test]
    fn a_worker_takes_only_the_entry_made_for_its_own_run() {
        use eddy_crds::resource::PodTasks;
        let entry = |run: Option<&str>| PodTasks {
            active: vec!["0_1".into()],
            warmup: vec!["0_2".into()],
            incarnation: run.map(str::to_string),
            ..Default::default()
        };
        let assignment = |run| Assignment {
            generation: 7,
            partitions: vec![4],
            pods: [
                ("a-0".to_string(), entry(run)),
                ("a-1".to_string(), PodTasks::default()),
            ]
            .into(),
            down: vec!["a-2".into()],
        };
        let mine = Desired::from_assignment(&assignment(Some("run-2")), "a-0", "run-2");
        assert_eq!((mine.active, mine.warmup), (ids(&[1]), ids(&[2])));
        assert_eq!(mine.down, ["a-2"]);
        assert_eq!(mine.pods, ["a-0", "a-1"]);
        // Made for the previous run, or before the operator saw any: nothing, same generation
        // (applying it reports this run holds nothing).
        for run in [Some("run-1"), None] {
            let d = Desired::from_assignment(&assignment(run), "a-0", "run-2");
            assert!(
                d.active.is_empty() && d.standby.is_empty() && d.warmup.is_empty(),
                "{run:?}"
            );
            assert_eq!(d.generation, 7);
        }
    }

    #[test]
    fn failed_over_pods_are_fenced_unless_back_on_this_generation_without_the_tasks() {
        let peer = |applied_generation: i64, active: &[i32]| Peer {
            applied_generation,
            active: ids(active),
            stopping: false,
        };
        let peers: HashMap<String, Peer> = [
            // Killed while running 0_2 and 0_4: its last report, of generation 3, says so.
            ("dead".to_string(), peer(3, &[2, 4])),
            // Killed right after taking 0_6 in generation 4, before reporting it.
            ("quick".to_string(), peer(3, &[])),
            // Failed over in generation 4, back already and running 0_7 there.
            ("back".to_string(), peer(4, &[7])),
            ("me".to_string(), peer(4, &[1])),
        ]
        .into();
        let pods = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let down = pods(&["dead", "quick", "back", "gone", "me"]);
        // Taking 0_6 in generation 4: every failed-over pod whose report predates it, and the
        // pod nothing is known of; not the one back on generation 4 without 0_6.
        assert_eq!(
            to_fence(&peers, &ids(&[6]), &down, 4, "me"),
            pods(&["dead", "gone", "quick"])
        );
        // The pod that is back is fenced when it reports the task taken.
        assert_eq!(
            to_fence(&peers, &ids(&[7]), &down, 4, "me"),
            pods(&["back", "dead", "gone", "quick"])
        );
        // Its report of generation 4 is stale for generation 5.
        assert_eq!(
            to_fence(&peers, &ids(&[6]), &pods(&["back"]), 5, "me"),
            pods(&["back"])
        );
        // Never this worker itself; nothing without failed-over pods.
        assert!(to_fence(&peers, &ids(&[1]), &pods(&["me"]), 4, "me").is_empty());
        assert!(to_fence(&peers, &ids(&[4]), &[], 4, "me").is_empty());
    }

    #[test]
    fn a_generation_starts_promotes_demotes_and_releases() {
        let desired = Desired {
            generation: 2,
            active: ids(&[0, 1, 2]),
            standby: ids(&[3, 5]),
            warmup: ids(&[4]),
            ..Default::default()
        };
        // Held: 0 active (stays), 1 standby (promoted), 3 active (demoted to standby),
        // 6 active (released), 5 standby (stays), 7 standby (dropped).
        let c = changes(&ids(&[0, 3, 6]), &ids(&[1, 5, 7]), &desired);
        assert_eq!(c.start, ids(&[2]));
        assert_eq!(c.promote, ids(&[1]));
        assert_eq!(c.demote, ids(&[3]));
        assert_eq!(c.release, ids(&[6]));
        assert_eq!(
            c.replicas,
            vec![
                (TaskId::new(0, 3), TaskRole::Standby),
                (TaskId::new(0, 4), TaskRole::Warmup),
                (TaskId::new(0, 5), TaskRole::Standby),
            ]
        );
        assert_eq!(c.gained(), ids(&[1, 2]));
        assert_eq!(c.lost(), ids(&[3, 6]));
        assert!(!c.actives_unchanged());
    }

    #[test]
    fn only_replicas_changing_leaves_the_actives_alone() {
        let desired = Desired {
            generation: 3,
            active: ids(&[0]),
            standby: ids(&[1]),
            ..Default::default()
        };
        let c = changes(&ids(&[0]), &[], &desired);
        assert!(c.actives_unchanged());
        assert_eq!(c.replicas, vec![(TaskId::new(0, 1), TaskRole::Standby)]);
    }

    #[test]
    fn active_wins_over_replica_roles_and_warmup_over_standby() {
        let d = Desired {
            active: ids(&[0]),
            standby: ids(&[0, 1, 2]),
            warmup: ids(&[2]),
            ..Default::default()
        };
        assert_eq!(
            d.replicas(),
            vec![
                (TaskId::new(0, 1), TaskRole::Standby),
                (TaskId::new(0, 2), TaskRole::Warmup),
            ]
        );
    }

    #[test]
    fn unknown_tasks_are_set_apart() {
        let mut d = Desired {
            active: ids(&[0, 9]),
            standby: ids(&[8]),
            ..Default::default()
        };
        let unknown = d.retain_known(&ids(&[0, 1]));
        assert_eq!(d.active, ids(&[0]));
        assert!(d.standby.is_empty());
        assert_eq!(unknown, ids(&[9, 8]));
    }

    #[test]
    fn holders_report_the_task_active_or_have_not_applied_the_generation() {
        let peer = |applied_generation: i64, active: &[i32]| Peer {
            applied_generation,
            active: ids(active),
            stopping: false,
        };
        let peers = HashMap::from([
            ("a".to_string(), peer(2, &[0])),
            ("b".to_string(), peer(2, &[1])),
            // Took 0_4 in generation 2 (say) and has not reported it: its report is of
            // generation 1.
            ("c".to_string(), peer(1, &[5])),
            // Applied generation 3 already: holds only what it reports.
            ("d".to_string(), peer(3, &[6])),
            // Left the assignment (scaled in after draining); its last report stays.
            ("e".to_string(), peer(1, &[])),
        ]);
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let pods = s(&["a", "b", "c", "d", "me"]);
        // Taking 0_0 and 0_1 in generation 2: their reporters; c is behind, waited for too.
        assert_eq!(
            holders(&peers, &ids(&[0, 1]), &[], 2, &pods),
            s(&["a", "b", "c"])
        );
        // Taking 0_4 in generation 3: whoever has not applied it.
        assert_eq!(
            holders(&peers, &ids(&[4]), &[], 3, &pods),
            s(&["a", "b", "c"])
        );
        // Failed-over pods are not waited for.
        assert_eq!(
            holders(&peers, &ids(&[0, 4]), &s(&["a", "c"]), 3, &pods),
            s(&["b"])
        );
        // A stopping worker takes nothing new: behind or not, it holds what it reports.
        let mut stopping = peers.clone();
        for p in stopping.values_mut() {
            p.stopping = true;
        }
        assert!(holders(&stopping, &ids(&[4]), &[], 3, &pods).is_empty());
        assert_eq!(holders(&stopping, &ids(&[5]), &[], 3, &pods), s(&["c"]));
        // Everybody applied generation 2 or more, nobody reports 0_2: nothing to wait for.
        assert!(holders(&peers, &ids(&[2]), &s(&["c"]), 2, &pods).is_empty());
        // A pod outside the assignment is waited for only while it reports the task.
        assert!(holders(&peers, &ids(&[2]), &s(&["c"]), 2, &s(&["a", "b", "d"])).is_empty());
        let pods_e = s(&["a", "b", "d"]);
        assert_eq!(
            holders(
                &HashMap::from([("e".to_string(), peer(1, &[2]))]),
                &ids(&[2]),
                &[],
                2,
                &pods_e
            ),
            s(&["e"])
        );
    }

    #[test]
    fn lag_is_the_distance_to_the_end() {
        assert_eq!(lag(10, Some(25)), Some(15));
        assert_eq!(lag(30, Some(25)), Some(0));
        assert_eq!(lag(10, None), None);
    }
}
