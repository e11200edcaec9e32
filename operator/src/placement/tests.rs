//! The assignor's rules, step by step: each step's output and the workers' (fake) reports
//! are fed back in, as the operator and the workers do.

use super::*;
use eddy_crds::resource::{TaskState, TaskStatus};

struct Sim {
    partitions: Vec<i32>,
    stateful: Vec<bool>,
    replicas: i32,
    standbys: usize,
    max_warmups: usize,
    acceptable: i64,
    /// None: every pod up.
    health: Option<BTreeMap<String, Health>>,
    assignment: Option<Assignment>,
    reports: BTreeMap<String, WorkerStatus>,
    reason: Option<Reason>,
}

impl Sim {
    fn new(partitions: &[i32], replicas: i32) -> Self {
        Sim {
            partitions: partitions.to_vec(),
            stateful: vec![true; partitions.len()],
            replicas,
            standbys: 0,
            max_warmups: 2,
            acceptable: 10_000,
            health: None,
            assignment: None,
            reports: BTreeMap::new(),
            reason: None,
        }
    }

    fn step(&mut self) -> Placement {
        let p = place(&Input {
            app: "a",
            partitions: &self.partitions,
            stateful: &self.stateful,
            replicas: self.replicas,
            health: self.health.as_ref(),
            previous: self.assignment.as_ref(),
            reports: &self.reports,
            standby_replicas: self.standbys,
            max_warmups: self.max_warmups,
            acceptable_lag: self.acceptable,
            previous_reason: self.reason,
            draining: None,
            restarting: None,
        });
        check(&p.assignment, self);
        self.assignment = Some(p.assignment.clone());
        self.reason = Some(p.progress.reason);
        p
    }

    /// Every pod of the assignment applies it and reports: actives running with lag 0,
    /// standbys and warm-ups with `lag(pod, task)`.
    fn report(&mut self, lag: impl Fn(&str, &str) -> i64) {
        let a = self.assignment.clone().expect("assignment");
        self.reports.clear();
        for (pod, t) in &a.pods {
            if self
                .health
                .as_ref()
                .is_some_and(|h| !h.get(pod).is_some_and(Health::is_up))
            {
                continue;
            }
            let mut tasks = BTreeMap::new();
            let roles = [
                (&t.active, TaskRole::Active),
                (&t.standby, TaskRole::Standby),
                (&t.warmup, TaskRole::Warmup),
            ];
            for (ids, role) in roles {
                for id in ids {
                    let l = if role == TaskRole::Active {
                        0
                    } else {
                        lag(pod, id)
                    };
                    tasks.insert(
                        id.clone(),
                        TaskStatus {
                            role,
                            state: TaskState::Running,
                            restore_backlog: 0,
                            lag: Some(l),
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

    /// Step and report (copies caught up at once) until nothing changes; every step's moves.
    fn settle(&mut self) -> Vec<Move> {
        let mut moves = Vec::new();
        for _ in 0..200 {
            let before = self.assignment.as_ref().map(|a| a.generation);
            let p = self.step();
            moves.extend(p.moves.clone());
            self.report(|_, _| 0);
            if Some(p.assignment.generation) == before
                && p.progress.reason == Reason::Stable
                && p.stateful_set_replicas == self.replicas
            {
                return moves;
            }
        }
        panic!("did not settle: {:?}", self.assignment);
    }

    fn a(&self) -> &Assignment {
        self.assignment.as_ref().expect("assignment")
    }

    fn set_down(&mut self, pod: &str, cause: DownCause) {
        let mut h = self
            .health
            .clone()
            .unwrap_or_else(|| (0..8).map(|i| (format!("a-{i}"), Health::Up)).collect());
        h.insert(pod.into(), Health::Down(cause));
        self.health = Some(h);
    }

    fn set_up(&mut self, pod: &str) {
        if let Some(h) = self.health.as_mut() {
            h.insert(pod.into(), Health::Up);
        }
    }
}

fn owner(a: &Assignment, task: &str) -> String {
    let owners: Vec<&String> = a
        .pods
        .iter()
        .filter(|(_, t)| t.active.iter().any(|x| x == task))
        .map(|(p, _)| p)
        .collect();
    assert_eq!(owners.len(), 1, "{task} active on {owners:?}");
    owners[0].clone()
}

fn loads(a: &Assignment) -> BTreeMap<String, usize> {
    a.pods
        .iter()
        .map(|(p, t)| (p.clone(), t.active.len()))
        .collect()
}

/// What holds after every step.
fn check(a: &Assignment, sim: &Sim) {
    let all: Vec<String> = tasks(&sim.partitions)
        .iter()
        .map(TaskId::to_string)
        .collect();
    for t in &all {
        owner(a, t);
    }
    let mut warmups = 0;
    for (pod, t) in &a.pods {
        let mut roles: Vec<&String> = t.active.iter().chain(&t.standby).chain(&t.warmup).collect();
        let n = roles.len();
        roles.sort();
        roles.dedup();
        assert_eq!(roles.len(), n, "{pod} holds a task in two roles: {t:?}");
        warmups += t.warmup.len();
        let leaving = ordinal(pod) >= u64::try_from(sim.replicas).unwrap_or(0);
        if leaving {
            assert!(
                t.standby.is_empty() && t.warmup.is_empty(),
                "copies on leaving {pod}"
            );
        }
        for id in t.standby.iter().chain(&t.warmup) {
            let sub: usize = id
                .split('_')
                .next()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            assert!(sim.stateful[sub], "copy of stateless {id} on {pod}");
        }
        for id in &t.standby {
            let holders = a.pods.values().filter(|x| x.standby.contains(id)).count();
            assert!(holders <= sim.standbys, "{id} has {holders} standbys");
        }
    }
    assert!(warmups <= sim.max_warmups, "{warmups} warm-ups: {a:?}");
}

fn balanced(a: &Assignment, replicas: i32) {
    let l: Vec<usize> = (0..replicas)
        .map(|i| a.pods.get(&format!("a-{i}")).map_or(0, |t| t.active.len()))
        .collect();
    let (min, max) = (
        l.iter().min().copied().unwrap_or(0),
        l.iter().max().copied().unwrap_or(0),
    );
    assert!(max - min <= 1, "unbalanced: {l:?}");
    assert!(
        a.pods
            .iter()
            .filter(|(p, _)| ordinal(p) >= u64::try_from(replicas).unwrap_or(0))
            .all(|(_, t)| t.active.is_empty()),
        "a leaving pod still has tasks"
    );
}

/// Tasks whose active changed between two assignments.
fn moved(a: &Assignment, b: &Assignment) -> usize {
    let mut n = 0;
    for (pod, t) in &a.pods {
        for id in &t.active {
            if !b.pods.get(pod).is_some_and(|x| x.active.contains(id)) {
                n += 1;
            }
        }
    }
    n
}

/// The fewest moves that take loads `a` to loads `b`: what every pod must shed.
fn fewest(a: &Assignment, b: &Assignment) -> usize {
    let (la, lb) = (loads(a), loads(b));
    la.iter()
        .map(|(p, n)| n.saturating_sub(lb.get(p).copied().unwrap_or(0)))
        .sum()
}

#[test]
fn first_placement_is_complete_and_balanced() {
    let mut sim = Sim::new(&[7, 5], 3);
    let p = sim.step();
    assert_eq!(p.assignment.generation, 1);
    assert_eq!(p.stateful_set_replicas, 3);
    assert!(p.moves.is_empty(), "a first placement moves nothing");
    balanced(sim.a(), 3);
}

#[test]
fn standbys_never_with_their_active_distinct_and_only_for_stateful_tasks() {
    let mut sim = Sim::new(&[6, 6], 4);
    sim.stateful = vec![false, true];
    sim.standbys = 2;
    sim.settle();
    let a = sim.a().clone();
    for t in tasks(&[6, 6]) {
        let id = t.to_string();
        let holders: Vec<&String> = a
            .pods
            .iter()
            .filter(|(_, x)| x.standby.contains(&id))
            .map(|(p, _)| p)
            .collect();
        if t.subtopology == 0 {
            assert!(holders.is_empty(), "stateless {id} has standbys");
        } else {
            assert_eq!(holders.len(), 2, "{id}: {holders:?}");
            assert!(
                !holders.contains(&&owner(&a, &id)),
                "{id} standby with its active"
            );
        }
    }
    // Standbys spread (12 over 4 pods), fewest first as a tie-break.
    let counts: Vec<usize> = a.pods.values().map(|t| t.standby.len()).collect();
    let (min, max) = (counts.iter().min(), counts.iter().max());
    assert!(min >= Some(&2) && max <= Some(&4), "{counts:?}");
}

#[test]
fn standbys_are_sticky_and_prefer_pods_that_hold_the_state() {
    let mut sim = Sim::new(&[4], 3);
    sim.standbys = 1;
    sim.settle();
    let before = sim.a().clone();
    // A reconcile with the same facts changes nothing.
    assert_eq!(sim.step().assignment, before);

    // A pod that reports a caught-up copy of a task gets its new standby: here a-2 is
    // given a copy of 0_0 (as a finished warm-up would leave it) and 0_0's standby holder
    // goes away.
    let id = "0_0";
    let holder = before
        .pods
        .iter()
        .find(|(_, t)| t.standby.iter().any(|x| x == id))
        .map(|(p, _)| p.clone())
        .expect("a standby");
    let active = owner(&before, id);
    let third = (0..3)
        .map(|i| format!("a-{i}"))
        .find(|p| *p != holder && *p != active)
        .expect("a third pod");
    sim.report(|_, _| 50_000);
    sim.reports.get_mut(&third).expect("report").tasks.insert(
        id.into(),
        TaskStatus {
            role: TaskRole::Standby,
            state: TaskState::Running,
            restore_backlog: 0,
            lag: Some(10),
        },
    );
    sim.set_down(&holder, DownCause::Terminating);
    let p = sim.step();
    assert!(
        p.assignment.pods[&third].standby.iter().any(|x| x == id),
        "{:?}",
        p.assignment
    );
}

#[test]
fn the_demoted_former_active_becomes_the_standby() {
    // Both tasks on a-0, their standbys on a-1: balance moves 0_1 to a-1, whose standby is
    // caught up, and a-0 (which reports 0_1 as its active, lag 0) keeps it as standby.
    let mut sim = Sim::new(&[2], 2);
    sim.standbys = 1;
    sim.assignment = Some(Assignment {
        generation: 7,
        partitions: vec![2],
        pods: BTreeMap::from([
            (
                "a-0".into(),
                PodTasks {
                    active: vec!["0_0".into(), "0_1".into()],
                    ..Default::default()
                },
            ),
            (
                "a-1".into(),
                PodTasks {
                    standby: vec!["0_0".into(), "0_1".into()],
                    ..Default::default()
                },
            ),
        ]),
        down: Vec::new(),
    });
    sim.report(|_, _| 0);
    let p = sim.step();
    assert_eq!(p.moves.len(), 1);
    assert_eq!(p.moves[0].task.to_string(), "0_1");
    assert_eq!(p.moves[0].why, Why::CaughtUp { lag: 0 });
    assert_eq!(p.assignment.pods["a-1"].active, ["0_1"]);
    assert_eq!(p.assignment.pods["a-1"].standby, ["0_0"], "sticky");
    assert_eq!(
        p.assignment.pods["a-0"].standby,
        ["0_1"],
        "the former active"
    );
    assert_eq!(p.assignment.generation, 8);
}

#[test]
fn scale_out_warms_up_within_the_limit_and_moves_on_catch_up_only() {
    let mut sim = Sim::new(&[12], 2);
    sim.settle();
    let start = sim.a().clone();
    sim.replicas = 4;
    let p = sim.step();
    assert!(
        p.moves.is_empty(),
        "nothing moves before a warm-up caught up"
    );
    assert_eq!(p.assignment.generation, start.generation + 1);
    assert_eq!(p.progress.reason, Reason::ScalingOut);
    let warm: Vec<(String, String)> = p
        .assignment
        .pods
        .iter()
        .flat_map(|(pod, t)| t.warmup.iter().map(move |id| (id.clone(), pod.clone())))
        .collect();
    assert_eq!(warm.len(), 2, "maxWarmupReplicas: {:?}", p.assignment);
    assert!(warm.iter().all(|(_, pod)| pod == "a-2" || pod == "a-3"));
    assert_eq!(
        loads(&p.assignment),
        loads(&start)
            .into_iter()
            .chain([("a-2".into(), 0), ("a-3".into(), 0)])
            .collect()
    );

    // Lag above the bound: nothing moves, the same warm-ups stay, the generation too.
    sim.report(|_, _| 10_001);
    let q = sim.step();
    assert!(q.moves.is_empty());
    assert_eq!(q.assignment, p.assignment);
    assert_eq!(q.progress.reason, Reason::ScalingOut);
    assert!(
        q.progress.message.contains("lag 10001"),
        "{}",
        q.progress.message
    );

    // At the bound: both move, and the next two warm-ups start.
    sim.report(|_, _| 10_000);
    let r = sim.step();
    assert_eq!(r.moves.len(), 2);
    for m in &r.moves {
        assert_eq!(m.why, Why::CaughtUp { lag: 10_000 });
        assert!(warm.contains(&(m.task.to_string(), m.to.clone())));
    }
    let events = describe_moves(&r.moves, 10_000);
    assert!(
        events.iter().all(|(reason, m)| reason == "TasksMoved"
            && m.contains("caught up (lag 10000")
            && m.contains("≤ 10000")),
        "{events:?}"
    );
    let now_warm: usize = r.assignment.pods.values().map(|t| t.warmup.len()).sum();
    assert_eq!(now_warm, 2);

    let moves = sim.settle();
    balanced(sim.a(), 4);
    assert_eq!(moves.len() + 2, 6, "only what balance needs moves");
    assert_eq!(moved(&start, sim.a()), 6);
    assert_eq!(sim.reason, Some(Reason::Stable));
}

#[test]
fn existing_warm_ups_are_kept_first() {
    let mut sim = Sim::new(&[12], 2);
    sim.max_warmups = 1;
    sim.settle();
    sim.replicas = 3;
    let first = sim.step();
    let w: Vec<String> = first.assignment.pods["a-2"].warmup.clone();
    assert_eq!(w.len(), 1);
    for _ in 0..3 {
        sim.report(|_, _| 1_000_000);
        let p = sim.step();
        assert_eq!(
            p.assignment.pods["a-2"].warmup, w,
            "the running warm-up is kept"
        );
    }
}

#[test]
fn a_standby_on_the_target_is_its_warm_up() {
    let mut sim = Sim::new(&[6], 2);
    sim.standbys = 1;
    sim.settle();
    // The new pod a-2 gets standbys of some tasks; the moves to it wait for a caught-up copy,
    // and a task whose standby a-2 holds needs no extra warm-up.
    sim.replicas = 3;
    for _ in 0..4 {
        let p = sim.step();
        for (id, _) in p.assignment.pods["a-2"].warmup.iter().map(|x| (x, ())) {
            assert!(!p.assignment.pods["a-2"].standby.contains(id));
        }
        sim.report(|pod, _| if pod == "a-2" { 50_000 } else { 0 });
    }
    let a = sim.a();
    assert_eq!(
        a.pods["a-2"].active.len(),
        0,
        "nothing moved before catch-up"
    );
    sim.settle();
    balanced(sim.a(), 3);
}

#[test]
fn stateless_tasks_move_at_once() {
    let mut sim = Sim::new(&[6], 2);
    sim.stateful = vec![false];
    sim.settle();
    sim.replicas = 3;
    let p = sim.step();
    assert_eq!(p.moves.len(), 2);
    assert!(p.moves.iter().all(|m| m.why == Why::Stateless));
    assert!(p.assignment.pods.values().all(|t| t.warmup.is_empty()));
    balanced(&p.assignment, 3);
}

#[test]
fn workers_that_report_no_lag_get_tasks_at_once() {
    let mut sim = Sim::new(&[6], 2);
    sim.settle();
    for w in sim.reports.values_mut() {
        for t in w.tasks.values_mut() {
            t.lag = None;
        }
    }
    sim.replicas = 3;
    let p = sim.step();
    assert_eq!(p.moves.len(), 2);
    assert!(p.moves.iter().all(|m| m.why == Why::LagNotReported));
    balanced(&p.assignment, 3);
}

#[test]
fn scale_in_drains_before_the_stateful_set_shrinks() {
    let mut sim = Sim::new(&[12], 3);
    sim.settle();
    sim.replicas = 1;
    let mut saw_draining = false;
    for _ in 0..50 {
        let p = sim.step();
        let busiest = p
            .assignment
            .pods
            .iter()
            .filter(|(_, t)| !t.active.is_empty())
            .map(|(pod, _)| ordinal(pod) + 1)
            .max()
            .unwrap_or(0);
        assert!(
            u64::try_from(p.stateful_set_replicas).unwrap_or(0) >= busiest,
            "the StatefulSet ({}) would cut a pod with tasks off: {:?}",
            p.stateful_set_replicas,
            p.assignment
        );
        if p.stateful_set_replicas > 1 {
            assert_eq!(p.progress.reason, Reason::Draining);
            saw_draining = true;
        } else {
            // The leaving pods have let go of their tasks (in their reports) first.
            for pod in ["a-1", "a-2"] {
                assert!(
                    sim.reports.get(pod).is_none_or(|w| w.tasks.is_empty()),
                    "{pod} still reports tasks"
                );
            }
            break;
        }
        // Warm-ups need two reports to catch up here.
        sim.report(|_, _| 20_000);
        sim.step();
        sim.report(|_, _| 0);
    }
    assert!(saw_draining);
    sim.settle();
    assert_eq!(sim.a().pods.len(), 1);
    assert_eq!(sim.a().pods["a-0"].active.len(), 12);
}

#[test]
fn the_stateful_set_waits_for_the_leaving_pod_to_release() {
    let mut sim = Sim::new(&[2], 2);
    sim.stateful = vec![false];
    sim.settle();
    sim.replicas = 1;
    let p = sim.step();
    assert_eq!(p.moves.len(), 1, "stateless: moved at once");
    assert_eq!(p.stateful_set_replicas, 2, "a-1 still reports the task");
    assert_eq!(p.progress.reason, Reason::Draining);
    assert!(
        p.progress.message.contains("report"),
        "{}",
        p.progress.message
    );
    sim.report(|_, _| 0);
    assert_eq!(sim.step().stateful_set_replicas, 1);
}

#[test]
fn scale_in_moves_to_caught_up_standbys_at_once() {
    let mut sim = Sim::new(&[4], 2);
    sim.standbys = 1;
    sim.settle();
    sim.replicas = 1;
    let p = sim.step();
    assert_eq!(p.moves.len(), 2, "{:?}", p.assignment);
    assert!(
        p.moves
            .iter()
            .all(|m| m.to == "a-0" && matches!(m.why, Why::CaughtUp { lag: 0 }))
    );
    assert!(
        p.assignment
            .pods
            .values()
            .all(|t| t.warmup.is_empty() && t.standby.is_empty())
    );
}

#[test]
fn failover_goes_to_the_standby_with_least_lag_for_each_cause() {
    let causes = [
        DownCause::Gone,
        DownCause::Terminating,
        DownCause::NotRunning("CrashLoopBackOff".into()),
        DownCause::NotStarted(40),
        DownCause::Silent(31),
        DownCause::NeverReported(45),
    ];
    for cause in causes {
        let mut sim = Sim::new(&[6], 3);
        sim.standbys = 2;
        sim.settle();
        let before = sim.a().clone();
        let victim = "a-1";
        let lost = before.pods[victim].active.clone();
        // Copies on a-2 lag less for even partitions, on a-0 for odd ones.
        sim.report(|pod, id| {
            let even = id.ends_with('0') || id.ends_with('2') || id.ends_with('4');
            match (pod, even) {
                ("a-2", true) | ("a-0", false) => 5,
                _ => 500,
            }
        });
        sim.set_down(victim, cause.clone());
        let p = sim.step();
        assert_eq!(p.assignment.down, [victim], "{cause:?}");
        assert_eq!(p.progress.reason, Reason::FailingOver);
        assert!(
            p.progress.message.contains(&cause.to_string()),
            "{}",
            p.progress.message
        );
        assert!(p.assignment.pods[victim].active.is_empty());
        for id in &lost {
            let even = id.ends_with('0') || id.ends_with('2') || id.ends_with('4');
            let want = if even { "a-2" } else { "a-0" };
            assert_eq!(owner(&p.assignment, id), want, "{id} after {cause:?}");
        }
        assert_eq!(p.moves.len(), lost.len());
        assert!(
            p.moves
                .iter()
                .all(|m| matches!(&m.why, Why::Failover { cause: c, lag: Some(5) } if *c == cause))
        );
        let events = describe_moves(&p.moves, 10_000);
        assert!(
            events
                .iter()
                .all(|(r, m)| r == "TasksFailedOver" && m.contains("a-1 (") && m.contains("lag 5")),
            "{events:?}"
        );
    }
}

#[test]
fn failover_without_standbys_goes_to_the_least_loaded() {
    let mut sim = Sim::new(&[7], 3);
    sim.settle();
    let before = loads(sim.a());
    // a-0 has 3, a-1 and a-2 have 2: a-0's three tasks go to the other two, least loaded
    // first (ties by ordinal).
    assert_eq!(before["a-0"], 3);
    sim.set_down("a-0", DownCause::Gone);
    let p = sim.step();
    let after = loads(&p.assignment);
    assert_eq!(after["a-0"], 0);
    assert_eq!((after["a-1"], after["a-2"]), (4, 3));
    assert!(
        p.moves
            .iter()
            .all(|m| matches!(m.why, Why::Failover { lag: None, .. }))
    );
    let events = describe_moves(&p.moves, 10_000);
    assert!(
        events.iter().all(|(_, m)| m.contains("restores in full")),
        "{events:?}"
    );
}

#[test]
fn a_pod_back_from_failover_leaves_down_once_it_reports_and_gets_tasks_through_warm_ups() {
    let mut sim = Sim::new(&[6], 3);
    sim.standbys = 1;
    sim.settle();
    sim.set_down("a-1", DownCause::Terminating);
    sim.step();
    sim.report(|_, _| 0);
    // Back, but not reported yet: still down, nothing moves to it.
    sim.health
        .as_mut()
        .expect("health")
        .insert("a-1".into(), Health::Starting);
    let p = sim.step();
    assert_eq!(p.assignment.down, ["a-1"]);
    assert_eq!(p.progress.reason, Reason::FailingOver);
    sim.set_up("a-1");
    // Its copies lag a while; the moves wait for them.
    sim.report(|pod, _| if pod == "a-1" { 30_000 } else { 0 });
    let p = sim.step();
    assert!(p.assignment.down.is_empty());
    assert_eq!(p.progress.reason, Reason::WarmingUp);
    assert!(p.assignment.pods["a-1"].active.is_empty());
    assert!(
        !p.assignment.pods["a-1"].warmup.is_empty() || !p.assignment.pods["a-1"].standby.is_empty()
    );
    sim.settle();
    balanced(sim.a(), 3);
}

#[test]
fn with_no_pod_up_tasks_stay_where_they_are() {
    let mut sim = Sim::new(&[4], 1);
    sim.settle();
    let before = sim.a().clone();
    sim.set_down("a-0", DownCause::NotRunning("CrashLoopBackOff".into()));
    let p = sim.step();
    assert_eq!(p.assignment.pods, before.pods);
    assert!(p.moves.is_empty());
}

#[test]
fn replicas_beyond_tasks_leave_pods_empty() {
    let mut sim = Sim::new(&[2], 5);
    sim.standbys = 1;
    sim.settle();
    let a = sim.a();
    assert_eq!(a.pods.len(), 5);
    assert_eq!(a.pods.values().filter(|t| t.active.is_empty()).count(), 3);
    assert_eq!(sim.step().stateful_set_replicas, 5);
}

#[test]
fn the_generation_changes_only_with_the_assignment() {
    let mut sim = Sim::new(&[4], 2);
    sim.settle();
    let g = sim.a().generation;
    for _ in 0..3 {
        sim.report(|_, _| 0);
        assert_eq!(sim.step().assignment.generation, g);
    }
    sim.partitions = vec![6];
    let p = sim.step();
    assert_eq!(p.assignment.generation, g + 1);
    assert!(p.moves.is_empty(), "new tasks are placed, not moved");
    balanced(&p.assignment, 2);
}

#[test]
fn scale_2_4_1_3_stays_sticky() {
    let mut sim = Sim::new(&[12, 12], 2);
    sim.standbys = 1;
    sim.settle();
    let mut last = sim.a().clone();
    for r in [4, 1, 3] {
        sim.replicas = r;
        sim.settle();
        let now = sim.a().clone();
        balanced(&now, r);
        assert_eq!(
            moved(&last, &now),
            fewest(&last, &now),
            "{r} replicas: {now:?}"
        );
        let sts = sim.step().stateful_set_replicas;
        assert_eq!(sts, r);
        last = now;
    }
}

#[test]
fn balanced_and_sticky_for_every_small_shape() {
    for replicas in 1..=6 {
        for partitions in 1..=12 {
            for standbys in 0..=2usize {
                if standbys >= usize::try_from(replicas).unwrap_or(0) {
                    continue;
                }
                let mut sim = Sim::new(&[partitions], replicas);
                sim.standbys = standbys;
                sim.settle();
                balanced(sim.a(), replicas);
                let expected = standbys.min(usize::try_from(replicas).unwrap_or(1) - 1);
                for t in tasks(&[partitions]) {
                    let id = t.to_string();
                    let holders = sim
                        .a()
                        .pods
                        .values()
                        .filter(|x| x.standby.contains(&id))
                        .count();
                    assert_eq!(
                        holders, expected,
                        "{replicas}/{partitions}/{standbys}: {id}"
                    );
                }
                let g = sim.a().generation;
                assert_eq!(sim.step().assignment.generation, g);
                // Scale to another size and back: only balance's moves, and settled.
                let other = replicas % 6 + 1;
                if standbys >= usize::try_from(other).unwrap_or(0) {
                    continue;
                }
                let before = sim.a().clone();
                sim.replicas = other;
                sim.settle();
                balanced(sim.a(), other);
                assert_eq!(
                    moved(&before, sim.a()),
                    fewest(&before, sim.a()),
                    "{replicas}->{other}/{partitions}/{standbys}"
                );
            }
        }
    }
}

#[test]
fn hold_replicas_keeps_pods_with_tasks() {
    let mut sim = Sim::new(&[4], 3);
    sim.settle();
    assert_eq!(hold_replicas("a", 1, sim.assignment.as_ref()), 3);
    assert_eq!(hold_replicas("a", 4, sim.assignment.as_ref()), 4);
    assert_eq!(hold_replicas("a", 0, sim.assignment.as_ref()), 0);
    // A forged pod name in the status does not scale the app.
    let mut forged = sim.assignment.clone().expect("settled");
    let tasks = forged
        .pods
        .values()
        .find(|t| !t.active.is_empty())
        .cloned()
        .expect("a pod");
    for name in ["a-2147483646", "a-1000", "b-7", "a-07"] {
        forged.pods.insert(name.into(), tasks.clone());
    }
    forged.pods.retain(|p, _| p != "a-1" && p != "a-2");
    assert_eq!(hold_replicas("a", 1, Some(&forged)), 1);
    assert_eq!(hold_replicas("a", i32::MAX, Some(&forged)), MAX_REPLICAS);
}

/// What a worker (or anyone with its ServiceAccount) could write into the status, fed to the
/// assignor: it neither crashes nor scales the StatefulSet, and keeps the app's own pods and
/// tasks only.
#[test]
fn a_forged_previous_assignment_scales_nothing_and_names_only_the_apps_pods() {
    for observed in [false, true] {
        let mut sim = Sim::new(&[4], 1);
        sim.settle();
        // The app's only pod is silent past the failover bound; the status names a pod of a
        // huge ordinal, pods of another app, tasks the app does not have.
        if observed {
            sim.set_down("a-0", DownCause::Silent(45));
            if let Some(h) = sim.health.as_mut() {
                h.retain(|p, _| p == "a-0");
            }
        }
        let mut forged = sim.a().clone();
        let forged_tasks = PodTasks {
            active: vec!["0_0".into(), "0_1".into(), "7_7".into(), "0_9".into()],
            standby: vec!["0_2".into(), "0_2".into()],
            ..Default::default()
        };
        for name in ["a-2147483646", "a-999", "other-3", "a-1"] {
            forged.pods.insert(name.into(), forged_tasks.clone());
        }
        forged.down = vec!["a-2147483646".into(), "x".into()];
        sim.assignment = Some(forged);
        let p = sim.step();
        assert!(
            p.stateful_set_replicas <= 1,
            "observed {observed}: the StatefulSet would grow to {}",
            p.stateful_set_replicas
        );
        for pod in p.assignment.pods.keys().chain(&p.assignment.down) {
            assert!(
                sanitize::pod_ordinal("a", pod).is_some_and(|o| o < 1000),
                "{pod}"
            );
        }
        assert!(!p.assignment.pods.contains_key("a-2147483646"));
        assert!(!p.assignment.pods.contains_key("other-3"));
        for t in p.assignment.pods.values() {
            for id in t.active.iter().chain(&t.standby).chain(&t.warmup) {
                assert!(["0_0", "0_1", "0_2", "0_3"].contains(&id.as_str()), "{id}");
            }
        }
    }
}

#[test]
fn a_negative_lag_is_unknown_not_caught_up() {
    let mut sim = Sim::new(&[4], 1);
    sim.settle();
    sim.replicas = 2;
    let p = sim.step();
    assert_eq!(p.progress.reason, Reason::ScalingOut);
    // The new pod claims copies lagging by less than nothing: nothing moves on that.
    sim.report(|pod, _| if pod == "a-1" { -1_000_000 } else { 0 });
    let p = sim.step();
    assert!(p.moves.is_empty(), "{:?}", p.moves);
    assert!(
        p.progress.message.contains("no lag reported yet"),
        "{}",
        p.progress.message
    );
    sim.report(|_, _| 0);
    assert_eq!(sim.step().moves.len(), 2);
}

#[test]
fn a_forged_generation_is_replaced_by_one_above_what_the_workers_applied() {
    for forged in [i64::MAX, sanitize::MAX_GENERATION, -5] {
        let mut sim = Sim::new(&[4], 2);
        sim.settle();
        let applied = sim.a().generation;
        sim.assignment.as_mut().expect("settled").generation = forged;
        let p = sim.step();
        assert_eq!(p.assignment.generation, applied + 1, "after {forged}");
        // Then on as usual.
        sim.report(|_, _| 0);
        assert_eq!(sim.step().assignment.generation, applied + 1);
    }
    // The last generation below the bound is still the operator's own: it does not wrap.
    let mut sim = Sim::new(&[4], 2);
    sim.settle();
    sim.assignment.as_mut().expect("settled").generation = sanitize::MAX_GENERATION - 1;
    sim.partitions = vec![5];
    assert_eq!(sim.step().assignment.generation, sanitize::MAX_GENERATION);
}

#[test]
fn without_a_previous_assignment_the_generation_starts_above_the_applied_ones() {
    let mut sim = Sim::new(&[4], 2);
    sim.settle();
    sim.report(|_, _| 0);
    for w in sim.reports.values_mut() {
        w.applied_generation = 41;
    }
    // A worker's report of a generation nobody could have written does not count.
    sim.reports
        .get_mut("a-1")
        .expect("report")
        .applied_generation = i64::MAX;
    sim.assignment = None;
    assert_eq!(sim.step().assignment.generation, 42);
}

#[test]
fn scaled_to_zero_runs_nothing() {
    let mut sim = Sim::new(&[4], 2);
    sim.settle();
    let p = place(&Input {
        app: "a",
        partitions: &[4],
        stateful: &[true],
        replicas: 0,
        health: None,
        previous: sim.assignment.as_ref(),
        reports: &sim.reports,
        standby_replicas: 0,
        max_warmups: 2,
        acceptable_lag: 10_000,
        previous_reason: None,
        draining: None,
        restarting: None,
    });
    assert!(p.assignment.pods.is_empty());
    assert_eq!(p.stateful_set_replicas, 0);
}

#[test]
fn a_stopping_pod_keeps_its_tasks_until_gone_then_they_fail_over() {
    let mut sim = Sim::new(&[6], 3);
    sim.standbys = 1;
    sim.settle();
    let held = sim.a().pods["a-1"].active.clone();
    assert!(!held.is_empty());
    let mut h: BTreeMap<String, Health> = (0..3).map(|i| (format!("a-{i}"), Health::Up)).collect();
    h.insert("a-1".into(), Health::Stopping);
    sim.health = Some(h);
    // Every copy is caught up, yet nothing leaves a-1 while its worker may still write.
    sim.report(|_, _| 0);
    let p = sim.step();
    assert_eq!(p.assignment.pods["a-1"].active, held);
    assert!(p.assignment.down.is_empty(), "{:?}", p.assignment);
    assert!(p.moves.is_empty(), "{:?}", p.moves);
    // Gone: its tasks fail over at once, and it is named down.
    sim.set_down("a-1", DownCause::Gone);
    let p = sim.step();
    assert_eq!(p.assignment.down, ["a-1"]);
    assert_eq!(p.moves.len(), held.len());
    for id in &held {
        assert_ne!(owner(&p.assignment, id), "a-1");
    }
}

#[test]
fn a_pod_handing_off_loses_its_actives_to_caught_up_copies_and_keeps_the_rest_until_gone() {
    let mut sim = Sim::new(&[6], 3);
    sim.standbys = 1;
    sim.settle();
    let held = sim.a().pods["a-1"].active.clone();
    assert!(held.len() >= 2, "{held:?}");
    let mut h: BTreeMap<String, Health> = (0..3).map(|i| (format!("a-{i}"), Health::Up)).collect();
    h.insert("a-1".into(), Health::HandingOff);
    sim.health = Some(h);
    // One of its tasks has a caught-up standby, the other's standby is far behind.
    let (quick, slow) = (held[0].clone(), held[1].clone());
    sim.report(|pod, task| {
        if pod != "a-1" && task == slow {
            1_000_000
        } else {
            0
        }
    });
    let standbys_before = sim.a().pods["a-1"].standby.clone();
    assert!(!standbys_before.is_empty());
    let p = sim.step();
    assert_ne!(owner(&p.assignment, &quick), "a-1", "{:?}", p.assignment);
    // It keeps the standbys it had (no restore elsewhere while it hands over), and gets no
    // new one, not even of a task it let go.
    assert_eq!(
        p.assignment.pods["a-1"].standby, standbys_before,
        "{:?}",
        p.assignment
    );
    assert!(
        p.moves
            .iter()
            .all(|m| m.from == "a-1" && matches!(m.why, Why::CaughtUp { .. })),
        "a hand-off, not a failover: {:?}",
        p.moves
    );
    assert_eq!(
        owner(&p.assignment, &slow),
        "a-1",
        "nowhere caught up to go"
    );
    assert!(p.assignment.down.is_empty(), "{:?}", p.assignment);
    assert_eq!(p.progress.reason, Reason::Draining, "{:?}", p.progress);
    assert!(
        p.progress.message.contains("a-1 stopping"),
        "{:?}",
        p.progress
    );
    // It takes nothing new, whatever the balance would like.
    for id in &p.assignment.pods["a-1"].active {
        assert!(held.contains(id), "{id} went to a pod that is stopping");
    }
    // Gone with a task left: that one fails over.
    sim.set_down("a-1", DownCause::Gone);
    let p = sim.step();
    assert_ne!(owner(&p.assignment, &slow), "a-1");
    assert_eq!(p.assignment.down, ["a-1"]);
}

#[test]
fn each_entry_names_the_worker_run_it_was_made_for() {
    let mut sim = Sim::new(&[4], 2);
    sim.settle();
    let name_runs = |sim: &mut Sim, runs: &[(&str, &str)]| {
        for (pod, run) in runs {
            sim.reports.get_mut(*pod).expect("report").incarnation = Some(run.to_string());
        }
    };
    name_runs(&mut sim, &[("a-0", "r1"), ("a-1", "s1")]);
    let p = sim.step();
    assert_eq!(p.assignment.pods["a-0"].incarnation.as_deref(), Some("r1"));
    assert_eq!(p.assignment.pods["a-1"].incarnation.as_deref(), Some("s1"));
    let held = p.assignment.pods["a-0"].active.clone();
    let generation = p.assignment.generation;
    // a-0 restarted and has not reported yet: its entry names no run (its new worker waits),
    // its tasks stay, and the generation moves on so every worker sees the change.
    let mut h: BTreeMap<String, Health> = (0..2).map(|i| (format!("a-{i}"), Health::Up)).collect();
    h.insert("a-0".into(), Health::Starting);
    sim.health = Some(h);
    let p = sim.step();
    assert_eq!(p.assignment.pods["a-0"].incarnation, None);
    assert_eq!(p.assignment.pods["a-0"].active, held);
    assert!(p.assignment.generation > generation);
    // Its new run reports: the next entry names it.
    sim.set_up("a-0");
    name_runs(&mut sim, &[("a-0", "r2"), ("a-1", "s1")]);
    let p = sim.step();
    assert_eq!(p.assignment.pods["a-0"].incarnation.as_deref(), Some("r2"));
    assert_eq!(p.assignment.pods["a-0"].active, held);
}

#[test]
fn more_standbys_than_other_pods_places_as_many_as_fit_and_says_so() {
    let mut sim = Sim::new(&[4], 2);
    sim.standbys = 2;
    sim.settle();
    for t in ["0_0", "0_1", "0_2", "0_3"] {
        let copies = sim
            .a()
            .pods
            .values()
            .filter(|p| p.standby.iter().any(|x| x == t))
            .count();
        assert_eq!(
            copies, 1,
            "{t}: one standby, on the pod that is not its active's"
        );
    }
    let p = sim.step();
    assert_eq!(p.progress.reason, Reason::Stable);
    let note = p.progress.note.unwrap_or_default();
    assert!(
        note.contains("4 tasks have fewer standbys than numStandbyReplicas 2"),
        "{note}"
    );
    // Scaled down to one pod: no standby fits, every task runs.
    sim.replicas = 1;
    sim.settle();
    assert!(sim.a().pods.values().all(|p| p.standby.is_empty()));
    assert_eq!(loads(sim.a())["a-0"], 4);
}

/// A pod back with a new container (its volume lost, say) has not reported yet: the report of
/// its previous container, which still names its old tasks as caught up, brings it nothing
/// back. Its copies count once its new worker reports them caught up.
#[test]
fn a_returning_pods_old_report_does_not_bring_its_tasks_back() {
    let mut sim = Sim::new(&[6], 3);
    sim.standbys = 1;
    sim.settle();
    let held = sim.a().pods["a-1"].active.clone();
    let stale = sim.reports["a-1"].clone();
    sim.set_down("a-1", DownCause::Gone);
    sim.step();
    sim.report(|_, _| 0);
    // The status keeps the old report of a-1 while the assignment names it.
    sim.reports.insert("a-1".into(), stale.clone());
    sim.health
        .as_mut()
        .expect("health")
        .insert("a-1".into(), Health::Starting);
    for _ in 0..3 {
        let p = sim.step();
        assert!(
            p.assignment.pods["a-1"].active.is_empty(),
            "{:?}",
            p.assignment
        );
        assert!(p.moves.is_empty(), "{:?}", p.moves);
        sim.report(|_, _| 0);
        sim.reports.insert("a-1".into(), stale.clone());
    }
    // Its new worker reports: its copies lag, nothing moves yet; then they catch up.
    sim.set_up("a-1");
    sim.report(|pod, _| if pod == "a-1" { 50_000 } else { 0 });
    let p = sim.step();
    assert!(p.assignment.pods["a-1"].active.is_empty());
    assert!(!held.is_empty());
    sim.settle();
    balanced(sim.a(), 3);
}
