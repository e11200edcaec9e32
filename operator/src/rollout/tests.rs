//! Rollouts step by step: the rollout's plan, the assignor's placement with the rollout's
//! pods, the restart, and the workers' (fake) reports fed back in, as the operator, the
//! StatefulSet controller and the workers do.

use super::*;
use crate::placement::{Input as PlaceInput, Why, place};
use eddy_crds::resource::TaskStatus;

const NEW: &str = "rev-2";
const OLD: &str = "rev-1";

/// One pod as the cluster shows it.
#[derive(Clone, Debug, PartialEq)]
enum Pod {
    /// Runs `revision`; its copies catch up after `warming` more steps.
    Running { revision: String, warming: u32 },
    /// Deleted, its container stopping.
    Terminating { revision: String },
    /// No Pod object (the StatefulSet recreates it next step from the new template).
    Gone,
    /// Created, its worker not reported yet.
    Starting { revision: String },
    /// Its worker container crash-loops.
    Failing { revision: String },
}

struct Sim {
    pods: BTreeMap<String, Pod>,
    replicas: i32,
    partitions: Vec<i32>,
    standbys: usize,
    acceptable: i64,
    /// Steps a restarted pod's copies take to catch up.
    catch_up: u32,
    /// The template revision pods are created from.
    template: String,
    rolled_out: Option<String>,
    assignment: Option<Assignment>,
    reports: BTreeMap<String, WorkerStatus>,
    /// What the new revision does to a pod that starts with it: crash-loop or run.
    broken: Option<String>,
    restarted: Vec<String>,
    /// Copies reported before (pod, task): a new copy lags on its first report, as a
    /// restore starts behind.
    copies: std::collections::BTreeSet<(String, String)>,
    /// Moves per task.
    moves: BTreeMap<String, usize>,
    /// The pod the last step drained.
    draining: Option<String>,
}

impl Sim {
    fn new(replicas: i32, partitions: i32, standbys: usize) -> Self {
        let pods = (0..replicas)
            .map(|i| {
                (
                    format!("a-{i}"),
                    Pod::Running {
                        revision: OLD.into(),
                        warming: 0,
                    },
                )
            })
            .collect();
        let mut sim = Sim {
            pods,
            replicas,
            partitions: vec![partitions],
            standbys,
            acceptable: 100,
            catch_up: 2,
            template: OLD.into(),
            rolled_out: Some(OLD.into()),
            assignment: None,
            reports: BTreeMap::new(),
            broken: None,
            restarted: Vec::new(),
            copies: Default::default(),
            moves: BTreeMap::new(),
            draining: None,
        };
        for _ in 0..20 {
            sim.step();
        }
        assert!(sim.restarted.is_empty());
        sim
    }

    fn health(&self) -> BTreeMap<String, Health> {
        self.pods
            .iter()
            .map(|(name, p)| {
                let h = match p {
                    Pod::Running { .. } => Health::Up,
                    Pod::Terminating { .. } => Health::Down(DownCause::Terminating),
                    Pod::Gone => Health::Down(DownCause::Gone),
                    Pod::Starting { .. } => Health::Starting,
                    Pod::Failing { .. } => {
                        Health::Down(DownCause::NotRunning("CrashLoopBackOff".into()))
                    }
                };
                (name.clone(), h)
            })
            .collect()
    }

    fn revisions(&self) -> BTreeMap<String, String> {
        self.pods
            .iter()
            .filter_map(|(name, p)| match p {
                Pod::Running { revision, .. }
                | Pod::Terminating { revision }
                | Pod::Starting { revision }
                | Pod::Failing { revision } => Some((name.clone(), revision.clone())),
                Pod::Gone => None,
            })
            .collect()
    }

    /// One reconcile and what follows it before the next: the plan, the placement, the
    /// restart; then the cluster moves on (a deleted pod goes, comes back, starts) and every
    /// running worker reports the assignment. Returns the plan and the placement.
    fn step(&mut self) -> (Plan, crate::placement::Placement) {
        let health = self.health();
        let revisions = self.revisions();
        let plan = plan(&Input {
            app: "a",
            replicas: self.replicas,
            update_revision: Some(&self.template),
            rolled_out: self.rolled_out.as_deref(),
            draining: self.draining.as_deref(),
            restarted: None,
            revisions: Some(&revisions),
            health: Some(&health),
            assignment: self.assignment.as_ref(),
            reports: &self.reports,
            acceptable_lag: self.acceptable,
        });
        let placed = place(&PlaceInput {
            app: "a",
            partitions: &self.partitions,
            stateful: &[true],
            replicas: self.replicas,
            health: Some(&health),
            previous: self.assignment.as_ref(),
            reports: &self.reports,
            standby_replicas: self.standbys,
            max_warmups: 2,
            acceptable_lag: self.acceptable,
            previous_reason: None,
            draining: plan.draining(),
            restarting: plan.restarting(),
        });
        // A task moves only to a caught-up copy, but from a pod that fails by itself.
        for m in &placed.moves {
            *self.moves.entry(m.task.to_string()).or_default() += 1;
            let failing = matches!(self.pods.get(&m.from), Some(Pod::Failing { .. }));
            assert!(
                matches!(m.why, Why::CaughtUp { .. }) || failing,
                "a task moved without a caught-up copy: {m:?}"
            );
        }
        let restart = restart(
            &plan,
            Some(&placed.assignment),
            &self.reports,
            Some(&health),
        );
        if let Some(pod) = restart
            .as_ref()
            .filter(|p| plan.draining() == Some(p.as_str()))
        {
            assert!(
                placed
                    .assignment
                    .pods
                    .get(pod)
                    .is_none_or(|t| t.active.is_empty()),
                "{pod} restarted with active tasks assigned"
            );
            assert!(
                !self
                    .reports
                    .get(pod)
                    .is_some_and(|w| w.tasks.values().any(|t| t.role == TaskRole::Active)),
                "{pod} restarted while its worker runs active tasks"
            );
        }
        self.assignment = Some(placed.assignment.clone());
        self.draining = plan.draining().map(str::to_string);
        if let Some(done) = plan.complete() {
            self.rolled_out = Some(done.to_string());
        }
        self.cluster(restart.as_deref());
        self.report();
        (plan, placed)
    }

    /// The StatefulSet controller and the kubelet between two reconciles.
    fn cluster(&mut self, restart: Option<&str>) {
        let template = self.template.clone();
        let broken = self.broken.clone();
        for (name, p) in self.pods.iter_mut() {
            *p = match p.clone() {
                Pod::Terminating { .. } => Pod::Gone,
                Pod::Gone => Pod::Starting {
                    revision: template.clone(),
                },
                Pod::Starting { revision } if broken.as_ref() == Some(&revision) => {
                    Pod::Failing { revision }
                }
                Pod::Starting { revision } => Pod::Running {
                    revision,
                    warming: self.catch_up,
                },
                Pod::Running { revision, warming } => Pod::Running {
                    revision,
                    warming: warming.saturating_sub(1),
                },
                failing @ Pod::Failing { .. } => failing,
            };
            if restart == Some(name.as_str())
                && let Pod::Running { revision, .. }
                | Pod::Starting { revision }
                | Pod::Failing { revision } = p.clone()
            {
                self.restarted.push(name.clone());
                *p = Pod::Terminating { revision };
            }
        }
    }

    /// Every running worker reports what it is assigned: actives running, copies lagging
    /// while its pod warms up.
    fn report(&mut self) {
        let a = self.assignment.clone().expect("assignment");
        self.reports.clear();
        for (pod, t) in &a.pods {
            let Some(Pod::Running { warming, .. }) = self.pods.get(pod) else {
                continue;
            };
            let warm = *warming == 0;
            let mut tasks = BTreeMap::new();
            for (ids, role) in [
                (&t.active, TaskRole::Active),
                (&t.standby, TaskRole::Standby),
                (&t.warmup, TaskRole::Warmup),
            ] {
                for id in ids {
                    let new = self.copies.insert((pod.clone(), id.clone()));
                    let lag = if warm && !new { 0 } else { 10_000 };
                    tasks.insert(
                        id.clone(),
                        TaskStatus {
                            role,
                            state: TaskState::Running,
                            restore_backlog: 0,
                            lag: Some(if role == TaskRole::Active { 0 } else { lag }),
                        },
                    );
                }
            }
            self.reports.insert(
                pod.clone(),
                WorkerStatus {
                    applied_generation: a.generation,
                    tasks,
                    ..Default::default()
                },
            );
        }
    }

    fn away(&self) -> usize {
        self.pods
            .values()
            .filter(|p| !matches!(p, Pod::Running { .. }))
            .count()
    }

    fn all_tasks_active_on_running_pods(&self) -> bool {
        let a = self.assignment.as_ref().expect("assignment");
        let active: usize = a
            .pods
            .iter()
            .filter(|(p, _)| matches!(self.pods.get(*p), Some(Pod::Running { .. })))
            .map(|(_, t)| t.active.len())
            .sum();
        active == self.partitions.iter().sum::<i32>() as usize
    }

    /// Roll to the new template until the rollout completes; every step checked.
    fn roll(&mut self) -> Vec<Plan> {
        self.template = NEW.into();
        self.moves.clear();
        let mut plans = Vec::new();
        for _ in 0..200 {
            let (plan, _) = self.step();
            assert!(self.away() <= 1, "two pods away at once: {:?}", self.pods);
            assert!(
                self.all_tasks_active_on_running_pods(),
                "a task is not active on a running pod: {:?} {:?}",
                self.pods,
                self.assignment
            );
            let complete = plan.complete().is_some();
            plans.push(plan);
            if complete {
                // A task moves off a pod before it restarts and maybe back after: never to
                // and fro while a restarted pod catches up.
                let most = self.moves.values().max().copied().unwrap_or(0);
                assert!(
                    most <= 2 * self.replicas as usize,
                    "tasks moved to and fro: {:?}",
                    self.moves
                );
                return plans;
            }
        }
        panic!("the rollout did not complete: {:?}", plans.last());
    }
}

#[test]
fn each_pod_is_emptied_restarted_and_caught_up_before_the_next() {
    for (replicas, partitions, standbys) in [(3, 6, 1), (3, 6, 0), (2, 4, 1), (4, 8, 2), (3, 2, 1)]
    {
        let mut sim = Sim::new(replicas, partitions, standbys);
        let plans = sim.roll();
        // Highest ordinal first, each pod once.
        let order: Vec<String> = (0..replicas).rev().map(|i| format!("a-{i}")).collect();
        assert_eq!(sim.restarted, order, "{replicas} pods, {standbys} standbys");
        let last = plans.last().expect("plans");
        assert_eq!(
            (last.done, last.total),
            (replicas as usize, replicas as usize)
        );
        assert!(
            sim.pods
                .values()
                .all(|p| matches!(p, Pod::Running { revision, .. } if revision == NEW))
        );
        // The done count only grows, and the next pod is taken only once the one before is
        // done.
        for w in plans.windows(2) {
            assert!(w[0].done <= w[1].done, "{:?} then {:?}", w[0], w[1]);
        }
        for p in &plans {
            if let Step::Next { pod, drain } = &p.step {
                assert!(*drain);
                let ordinal: usize = pod[2..].parse().expect("ordinal");
                assert_eq!(p.done, replicas as usize - 1 - ordinal, "{p:?}");
            }
        }
    }
}

#[test]
fn a_restarted_pod_keeps_its_copies_while_away_and_gets_tasks_back_once_caught_up() {
    let mut sim = Sim::new(3, 6, 1);
    let before = sim.assignment.clone().expect("assignment");
    sim.template = NEW.into();
    // Drain a-2: its actives move to its standbys' pods, it becomes their standby.
    let (plan, placed) = sim.step();
    assert_eq!(
        plan.step,
        Step::Next {
            pod: "a-2".into(),
            drain: true
        }
    );
    assert!(placed.assignment.pods["a-2"].active.is_empty());
    assert_eq!(
        placed.assignment.pods["a-2"].standby.len(),
        before.pods["a-2"].active.len() + before.pods["a-2"].standby.len(),
        "{:?}",
        placed.assignment
    );
    let copies = placed.assignment.pods["a-2"].standby.clone();
    // Restarted, away, back: its standbys stay assigned to it the whole time.
    for _ in 0..4 {
        let (_, placed) = sim.step();
        assert_eq!(placed.assignment.pods["a-2"].standby, copies);
        assert!(placed.assignment.pods["a-2"].active.is_empty());
    }
    assert_eq!(sim.restarted, ["a-2"]);
    // Caught up: tasks go back to it, then the next pod is taken.
    let plans = sim.roll();
    assert!(
        plans
            .iter()
            .any(|p| matches!(&p.step, Step::Next { pod, .. } if pod == "a-1"))
    );
    let a = sim.assignment.as_ref().expect("assignment");
    assert!(a.pods.values().all(|t| t.active.len() == 2), "{a:?}");
}

#[test]
fn a_restarted_pod_that_crash_loops_halts_the_rollout_and_a_fix_goes_on() {
    let mut sim = Sim::new(3, 6, 1);
    sim.template = NEW.into();
    sim.broken = Some(NEW.into());
    let mut halted = None;
    for _ in 0..30 {
        let (plan, _) = sim.step();
        if let Step::Halted { pod, why, starting } = &plan.step {
            halted = Some((pod.clone(), why.clone(), *starting));
        }
    }
    assert_eq!(
        halted,
        Some((
            "a-2".into(),
            "it runs the new pod template and is down (its worker container is not running: CrashLoopBackOff)".into(),
            false
        ))
    );
    assert_eq!(sim.restarted, ["a-2"], "never a cascade");
    assert!(sim.all_tasks_active_on_running_pods());
    // A fixed template is a new revision: the failing pod goes first (it serves nothing).
    sim.broken = None;
    sim.template = "rev-3".into();
    for _ in 0..200 {
        let (plan, _) = sim.step();
        if plan.complete() == Some("rev-3") {
            break;
        }
    }
    assert_eq!(sim.restarted, ["a-2", "a-2", "a-1", "a-0"]);
    assert_eq!(sim.rolled_out.as_deref(), Some("rev-3"));
}

#[test]
fn a_change_during_a_rollout_goes_on_with_the_new_revision() {
    let mut sim = Sim::new(3, 6, 1);
    sim.template = NEW.into();
    // Until a-2 restarted and a-1 is being drained.
    for _ in 0..40 {
        let (plan, _) = sim.step();
        if matches!(&plan.step, Step::Next { pod, .. } if pod == "a-1") {
            break;
        }
    }
    assert_eq!(sim.restarted, ["a-2"]);
    sim.template = "rev-3".into();
    for _ in 0..200 {
        let (plan, _) = sim.step();
        assert!(sim.away() <= 1);
        assert!(sim.all_tasks_active_on_running_pods());
        if plan.complete() == Some("rev-3") {
            break;
        }
    }
    // a-2 runs rev-2, outdated again: every pod restarts into rev-3 once.
    let mut again = sim.restarted[1..].to_vec();
    again.sort();
    assert_eq!(again, ["a-0", "a-1", "a-2"]);
}

#[test]
fn a_single_pod_restarts_with_its_tasks() {
    let mut sim = Sim::new(1, 4, 0);
    sim.template = NEW.into();
    let (plan, _) = sim.step();
    assert_eq!(
        plan.step,
        Step::Next {
            pod: "a-0".into(),
            drain: false
        }
    );
    assert_eq!(sim.restarted, ["a-0"]);
    assert!(plan.message(true, 100).contains("restarting a-0"));
}

#[test]
fn nothing_restarts_before_the_revision_and_the_pods_are_known() {
    let sim = Sim::new(3, 6, 1);
    let health = sim.health();
    let revisions = sim.revisions();
    let input = Input {
        app: "a",
        replicas: 3,
        update_revision: None,
        rolled_out: Some(OLD),
        draining: None,
        restarted: None,
        revisions: Some(&revisions),
        health: Some(&health),
        assignment: sim.assignment.as_ref(),
        reports: &sim.reports,
        acceptable_lag: 100,
    };
    assert_eq!(plan(&input).step, Step::Idle);
    let unknown = Input {
        update_revision: Some(NEW),
        revisions: None,
        ..input.clone()
    };
    assert_eq!(plan(&unknown).step, Step::Idle);
    // A new app: its pods are created from the revision, nothing to roll, complete once
    // every pod is done.
    let created = Input {
        update_revision: Some(OLD),
        rolled_out: None,
        ..input
    };
    let p = plan(&created);
    assert_eq!(p.step, Step::Idle);
    assert_eq!(p.complete(), Some(OLD));
}

#[test]
fn without_a_placement_nothing_restarts_and_the_rollout_says_why() {
    let mut sim = Sim::new(3, 6, 1);
    let health = sim.health();
    let revisions = sim.revisions();
    let p = plan(&Input {
        app: "a",
        replicas: 3,
        update_revision: Some(NEW),
        rolled_out: Some(OLD),
        draining: None,
        restarted: None,
        revisions: Some(&revisions),
        health: Some(&health),
        assignment: None,
        reports: &sim.reports,
        acceptable_lag: 100,
    });
    assert!(
        matches!(&p.step, Step::Waiting { why } if why.contains("cannot be placed")),
        "{p:?}"
    );
    assert_eq!(restart(&p, None, &sim.reports, Some(&health)), None);
    assert_eq!(
        restart(&p, sim.assignment.as_ref(), &sim.reports, Some(&health)),
        None
    );
    sim.template = NEW.into();
    sim.step();
    assert!(sim.restarted.is_empty());
}

#[test]
fn a_down_pod_is_restarted_first() {
    let mut sim = Sim::new(3, 6, 1);
    sim.pods.insert(
        "a-0".into(),
        Pod::Failing {
            revision: OLD.into(),
        },
    );
    for _ in 0..3 {
        sim.step();
    }
    sim.template = NEW.into();
    sim.step();
    assert_eq!(sim.restarted, ["a-0"]);
}

#[test]
fn the_message_says_what_the_rollout_waits_for() {
    let plan = Plan {
        revision: Some(NEW.into()),
        done: 1,
        total: 3,
        step: Step::Settling {
            pod: "a-2".into(),
            why: "its copies catch up (0_1 lag 30000)".into(),
        },
        may_restart: true,
        away: None,
    };
    assert_eq!(plan.summary(), "RollingUpdate 1/3");
    assert_eq!(
        plan.message(false, 10_000),
        "RollingUpdate 1/3 to revision rev-2: a-2 restarted; the next pod waits until its copies catch up (0_1 lag 30000) (acceptableRecoveryLag 10000)"
    );
}

/// [`restart`] of a plan, against the simulation's assignment, reports and health.
fn restart_of(sim: &Sim, p: &Plan) -> Option<String> {
    restart(
        p,
        sim.assignment.as_ref(),
        &sim.reports,
        Some(&sim.health()),
    )
}

/// The input of one plan from the simulation, with `edit` applied.
fn plan_of(sim: &Sim, edit: impl FnOnce(&mut Input)) -> Plan {
    let health = sim.health();
    let revisions = sim.revisions();
    let mut input = Input {
        app: "a",
        replicas: sim.replicas,
        update_revision: Some(&sim.template),
        rolled_out: sim.rolled_out.as_deref(),
        draining: sim.draining.as_deref(),
        restarted: None,
        revisions: Some(&revisions),
        health: Some(&health),
        assignment: sim.assignment.as_ref(),
        reports: &sim.reports,
        acceptable_lag: sim.acceptable,
    };
    edit(&mut input);
    plan(&input)
}

#[test]
fn a_drain_goes_on_while_the_pod_before_catches_up_but_not_while_a_pod_is_away() {
    let mut sim = Sim::new(3, 6, 1);
    sim.template = NEW.into();
    // Until a-1 is being drained.
    for _ in 0..40 {
        let (plan, _) = sim.step();
        if plan.draining() == Some("a-1") {
            break;
        }
    }
    assert_eq!(sim.draining.as_deref(), Some("a-1"));
    // a-2 (restarted) falls behind again: the drain goes on.
    sim.pods.insert(
        "a-2".into(),
        Pod::Running {
            revision: NEW.into(),
            warming: 3,
        },
    );
    sim.report();
    let p = plan_of(&sim, |_| {});
    assert_eq!(p.draining(), Some("a-1"), "{p:?}");
    // a-2 is evicted meanwhile: the drain stops, nothing restarts while a pod is away.
    sim.pods.insert("a-2".into(), Pod::Gone);
    let p = plan_of(&sim, |_| {});
    assert!(
        matches!(&p.step, Step::Settling { pod, .. } if pod == "a-2"),
        "{p:?}"
    );
    assert_eq!(restart_of(&sim, &p), None);
}

#[test]
fn a_restarted_pod_not_back_in_time_halts_the_rollout_and_gives_its_copies_up() {
    let mut sim = Sim::new(3, 6, 1);
    sim.template = NEW.into();
    sim.pods.insert("a-2".into(), Pod::Gone);
    let p = plan_of(&sim, |i| i.restarted = Some(("a-2", 60)));
    assert!(matches!(&p.step, Step::Settling { pod, .. } if pod == "a-2"));
    assert_eq!(p.restarting(), Some("a-2"), "its copies wait for it");
    let p = plan_of(&sim, |i| {
        i.restarted = Some(("a-2", BACK_WITHIN_SECONDS + 1))
    });
    let Step::Halted { pod, why, starting } = &p.step else {
        panic!("{p:?}");
    };
    assert_eq!((pod.as_str(), *starting), ("a-2", false));
    assert!(why.contains("is not back (its pod is gone)"), "{why}");
    assert_eq!(p.restarting(), None, "its standbys go to pods that are up");
}

#[test]
fn a_scale_in_goes_first() {
    let mut sim = Sim::new(3, 6, 1);
    sim.template = NEW.into();
    let p = plan_of(&sim, |i| i.replicas = 2);
    assert!(
        matches!(&p.step, Step::Waiting { why } if why.contains("1 leaving pod(s)")),
        "{p:?}"
    );
}

#[test]
fn unknown_revisions_keep_a_drain_and_restart_nothing() {
    let mut sim = Sim::new(3, 6, 1);
    sim.draining = Some("a-1".into());
    let p = plan_of(&sim, |i| i.revisions = None);
    assert_eq!(p.draining(), Some("a-1"));
    assert!(!p.may_restart);
    assert_eq!(restart_of(&sim, &p), None);
}

#[test]
fn workers_without_lag_reports_are_not_waited_for() {
    let mut sim = Sim::new(3, 6, 1);
    sim.template = NEW.into();
    for w in sim.reports.values_mut() {
        for t in w.tasks.values_mut() {
            t.lag = None;
        }
    }
    sim.pods.insert(
        "a-2".into(),
        Pod::Running {
            revision: NEW.into(),
            warming: 0,
        },
    );
    let p = plan_of(&sim, |_| {});
    assert!(
        matches!(&p.step, Step::Next { pod, .. } if pod == "a-1"),
        "{p:?}"
    );
}

#[test]
fn the_restart_time_is_kept_while_the_pod_is_away_and_not_pushed_on() {
    let mut sim = Sim::new(3, 6, 1);
    sim.template = NEW.into();
    sim.pods.insert("a-2".into(), Pod::Gone);
    let p = plan_of(&sim, |i| i.restarted = Some(("a-2", 10)));
    assert_eq!(p.away.as_deref(), Some("a-2"));
    let at = "2026-01-01T00:00:00Z";
    assert_eq!(
        restarted_annotation(&p, None, Some(("a-2", at)), "later").as_deref(),
        Some("a-2@2026-01-01T00:00:00Z"),
        "kept while away"
    );
    assert_eq!(
        restarted_annotation(&p, Some("a-2"), Some(("a-2", at)), "later").as_deref(),
        Some("a-2@2026-01-01T00:00:00Z"),
        "a restart asked again (a refused eviction) keeps the first time"
    );
    assert_eq!(
        restarted_annotation(&p, Some("a-1"), Some(("a-2", at)), "later").as_deref(),
        Some("a-1@later")
    );
    // Halted after the bound: still kept, so the halt stays.
    let p = plan_of(&sim, |i| {
        i.restarted = Some(("a-2", BACK_WITHIN_SECONDS + 1))
    });
    assert!(p.halted());
    assert!(restarted_annotation(&p, None, Some(("a-2", at)), "later").is_some());
    // Back: forgotten.
    sim.pods.insert(
        "a-2".into(),
        Pod::Running {
            revision: NEW.into(),
            warming: 1,
        },
    );
    let p = plan_of(&sim, |i| i.restarted = Some(("a-2", 10)));
    assert_eq!(p.away, None);
    assert_eq!(
        restarted_annotation(&p, None, Some(("a-2", at)), "later"),
        None
    );
}

#[test]
fn a_terminating_or_gone_pod_is_not_evicted_again() {
    let mut sim = Sim::new(3, 6, 1);
    sim.template = NEW.into();
    sim.pods.insert(
        "a-2".into(),
        Pod::Terminating {
            revision: OLD.into(),
        },
    );
    let p = plan_of(&sim, |_| {});
    assert!(
        matches!(&p.step, Step::Next { pod, .. } if pod == "a-2"),
        "{p:?}"
    );
    assert_eq!(restart_of(&sim, &p), None);
    sim.pods.insert(
        "a-2".into(),
        Pod::Failing {
            revision: OLD.into(),
        },
    );
    let p = plan_of(&sim, |_| {});
    assert_eq!(
        restart_of(&sim, &p).as_deref(),
        Some("a-2"),
        "a crash-looping pod is restarted at once"
    );
}
