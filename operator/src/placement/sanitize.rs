//! What pods write is input. `status.workers` is written by the app's workers, and whoever
//! runs with their ServiceAccount could (without the chart's admission policy) write any of
//! `status`, the previous assignment included. So everything the operator derives from the
//! status goes through here first: pod names it may create or wait for, tasks the app has,
//! numbers it adds up or compares, generations it counts on. What does not pass is dropped
//! (or counted as unknown), never trusted and never allowed to panic or allocate without bound.

use eddy_crds::TaskId;
use eddy_crds::manifest::MAX_REPLICAS;
use eddy_crds::resource::{Assignment, PodTasks, WorkerStatus};
use std::collections::{BTreeMap, BTreeSet};

pub use eddy_crds::resource::MAX_GENERATION;

/// A worker's problem message is shown in the app's `Degraded` condition: cut to this many
/// characters.
pub const MAX_PROBLEM_MESSAGE: usize = 1024;

/// The ordinal of a pod of the app's StatefulSet, `<app>-<n>` with `0 <= n < MAX_REPLICAS`
/// written as the StatefulSet writes it (no sign, no leading zero); None for any other name.
pub fn pod_ordinal(app: &str, pod: &str) -> Option<i32> {
    let n = pod.strip_prefix(app)?.strip_prefix('-')?;
    let canonical = !n.is_empty()
        && n.len() <= 4
        && n.bytes().all(|b| b.is_ascii_digit())
        && (n == "0" || !n.starts_with('0'));
    let n: i32 = n.parse().ok().filter(|_| canonical)?;
    (n < MAX_REPLICAS).then_some(n)
}

/// Whether `g` is a generation the operator could have written: below [`MAX_GENERATION`], as
/// workers follow only those.
pub fn sane_generation(g: i64) -> bool {
    (0..MAX_GENERATION).contains(&g)
}

/// The tasks an app has, to check task ids against; None when not known (Kafka unreachable):
/// then any well-formed id passes.
#[derive(Clone, Copy, Debug)]
pub struct Tasks<'a>(pub Option<&'a [i32]>);

impl Tasks<'_> {
    /// The task `id` names, if it is one the app has (or, unknown tasks, a well-formed id as
    /// the operator writes it).
    pub fn get(&self, id: &str) -> Option<TaskId> {
        let t: TaskId = id.parse().ok()?;
        // As the operator writes ids, so that one task has one spelling (`+0_1` is `0_1`).
        let canonical = t.partition >= 0 && t.to_string() == id;
        let exists = match self.0 {
            Some(partitions) => usize::try_from(t.subtopology)
                .ok()
                .and_then(|s| partitions.get(s))
                .is_some_and(|&n| t.partition < n),
            None => true,
        };
        (canonical && exists).then_some(t)
    }
}

/// The previous assignment, as far as the operator may act on it.
#[derive(Clone, Debug, PartialEq)]
pub struct Previous {
    pub assignment: Assignment,
    /// What was dropped, one phrase each (empty when the status was as the operator wrote it).
    pub dropped: Vec<String>,
}

/// Only the app's own pods (`<app>-<n>`, `n < MAX_REPLICAS`), in `pods` and `down`; only
/// tasks the app has, each once per pod and list; a generation from [`MAX_GENERATION`] up (or
/// negative) is kept as it is for `place` to replace, and said.
pub fn assignment(app: &str, tasks: Tasks, a: &Assignment) -> Previous {
    let mut dropped = Vec::new();
    let mut pods = BTreeMap::new();
    let mut foreign = Vec::new();
    let mut unknown: BTreeSet<String> = BTreeSet::new();
    for (pod, t) in &a.pods {
        if pod_ordinal(app, pod).is_none() {
            foreign.push(pod.clone());
            continue;
        }
        let mut list = |ids: &[String]| -> Vec<String> {
            let mut seen = BTreeSet::new();
            ids.iter()
                .filter(|id| match tasks.get(id) {
                    Some(t) => seen.insert(t),
                    None => {
                        unknown.insert((*id).clone());
                        false
                    }
                })
                .cloned()
                .collect()
        };
        pods.insert(
            pod.clone(),
            PodTasks {
                active: list(&t.active),
                standby: list(&t.standby),
                warmup: list(&t.warmup),
                incarnation: t.incarnation.clone(),
            },
        );
    }
    let mut down = Vec::new();
    for pod in &a.down {
        if pod_ordinal(app, pod).is_none() {
            foreign.push(pod.clone());
        } else if !down.contains(pod) {
            down.push(pod.clone());
        }
    }
    if !foreign.is_empty() {
        dropped.push(format!(
            "pods that are not this app's (<app>-<n>, n < {MAX_REPLICAS}): {}",
            shortened(foreign.iter())
        ));
    }
    if !unknown.is_empty() {
        dropped.push(format!(
            "tasks this app does not have: {}",
            shortened(unknown.iter())
        ));
    }
    if !sane_generation(a.generation) {
        dropped.push(format!(
            "generation {} (not below {MAX_GENERATION}): the next one starts above what the workers applied",
            a.generation
        ));
    }
    Previous {
        assignment: Assignment {
            generation: a.generation,
            partitions: a.partitions.clone(),
            pods,
            down,
        },
        dropped,
    }
}

/// At most a few names of a long list, for a log line.
fn shortened<'a>(names: impl ExactSizeIterator<Item = &'a String>) -> String {
    let n = names.len();
    let shown: Vec<&str> = names.take(5).map(String::as_str).collect();
    let mut s = shown.join(", ");
    if n > shown.len() {
        s.push_str(&format!(" and {} more", n - shown.len()));
    }
    s
}

/// The workers' reports the operator considers: only those of the app's own pods; per
/// report, only tasks the app has; a negative lag is unknown, a negative backlog 0, an
/// applied generation the operator cannot have written 0; a problem message cut short.
pub fn reports(
    app: &str,
    tasks: Tasks,
    reports: &BTreeMap<String, WorkerStatus>,
) -> BTreeMap<String, WorkerStatus> {
    reports
        .iter()
        .filter(|(pod, _)| pod_ordinal(app, pod).is_some())
        .map(|(pod, w)| {
            let mut w = w.clone();
            w.tasks.retain(|id, _| tasks.get(id).is_some());
            for t in w.tasks.values_mut() {
                t.restore_backlog = t.restore_backlog.max(0);
                t.lag = t.lag.filter(|l| *l >= 0);
            }
            w.global_backlog = w.global_backlog.max(0);
            if !(0..MAX_GENERATION).contains(&w.applied_generation) {
                w.applied_generation = 0;
            }
            if let Some(p) = w.problem.as_mut()
                && let Some((cut, _)) = p.message.char_indices().nth(MAX_PROBLEM_MESSAGE)
            {
                p.message.truncate(cut);
                p.message.push('…');
            }
            (pod.clone(), w)
        })
        .collect()
}

/// The highest generation a worker reports it applied (sanitized reports), 0 if none: a
/// new assignment without a previous one starts above it, so the workers (which take only a
/// newer generation) follow it.
pub fn applied_floor(reports: &BTreeMap<String, WorkerStatus>) -> i64 {
    reports
        .values()
        .map(|w| w.applied_generation)
        .filter(|g| (0..MAX_GENERATION).contains(g))
        .max()
        .unwrap_or(0)
}

/// The records left to restore across the workers: global tables and active tasks, added up
/// without overflowing.
pub fn backlog(reports: &BTreeMap<String, WorkerStatus>) -> i64 {
    reports
        .values()
        .flat_map(|w| {
            std::iter::once(w.global_backlog).chain(w.tasks.values().map(|t| t.restore_backlog))
        })
        .map(|n| n.max(0))
        .fold(0i64, i64::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;
    use eddy_crds::resource::WorkerProblemReason;
    use eddy_crds::resource::{TaskRole, TaskState, TaskStatus, WorkerProblem};

    #[test]
    fn only_the_apps_own_pod_names_pass() {
        assert_eq!(pod_ordinal("a", "a-0"), Some(0));
        assert_eq!(pod_ordinal("a", "a-7"), Some(7));
        assert_eq!(pod_ordinal("a", "a-999"), Some(MAX_REPLICAS - 1));
        assert_eq!(pod_ordinal("pv-2", "pv-2-3"), Some(3));
        for bad in [
            "a-1000",
            "a-2147483646",
            "a-99999999999999999999",
            "a--1",
            "a-+1",
            "a-01",
            "a-",
            "a",
            "b-1",
            "ab-1",
            "a-1-2",
            "a-1 ",
            "a-١",
            "",
        ] {
            assert_eq!(pod_ordinal("a", bad), None, "{bad:?}");
        }
    }

    #[test]
    fn task_ids_must_be_tasks_of_the_app() {
        let known = Tasks(Some(&[2, 1]));
        assert_eq!(known.get("0_1"), Some(TaskId::new(0, 1)));
        assert_eq!(known.get("1_0"), Some(TaskId::new(1, 0)));
        for bad in [
            "0_2",
            "1_1",
            "2_0",
            "0_-1",
            "+0_1",
            "x",
            "",
            "4294967296_0",
            "0_2147483648",
        ] {
            assert_eq!(known.get(bad), None, "{bad:?}");
        }
        let any = Tasks(None);
        assert_eq!(any.get("7_300"), Some(TaskId::new(7, 300)));
        for bad in ["0_-1", "+1_0", "01_0", "0_01", "x_1"] {
            assert_eq!(any.get(bad), None, "{bad:?}");
        }
    }

    fn pod(active: &[&str]) -> PodTasks {
        PodTasks {
            active: active.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_forged_assignment_keeps_only_real_pods_and_tasks() {
        let forged = Assignment {
            generation: 4,
            partitions: vec![2],
            pods: BTreeMap::from([
                ("a-0".into(), pod(&["0_0", "0_0", "0_7", "nonsense"])),
                ("a-2147483646".into(), pod(&["0_1"])),
                ("other-0".into(), pod(&["0_1"])),
                ("a-1".into(), pod(&["0_1"])),
            ]),
            down: vec!["a-1".into(), "a-1".into(), "a-5000".into()],
        };
        let p = assignment("a", Tasks(Some(&[2])), &forged);
        let pods: Vec<&str> = p.assignment.pods.keys().map(String::as_str).collect();
        assert_eq!(pods, ["a-0", "a-1"]);
        assert_eq!(p.assignment.pods["a-0"].active, ["0_0"]);
        assert_eq!(p.assignment.down, ["a-1"]);
        assert_eq!(p.assignment.generation, 4);
        assert_eq!(p.dropped.len(), 2, "{:?}", p.dropped);
        assert!(p.dropped[0].contains("a-2147483646"), "{:?}", p.dropped);
        assert!(p.dropped[1].contains("0_7"), "{:?}", p.dropped);

        // As the operator wrote it: nothing to say.
        let clean = assignment("a", Tasks(Some(&[2])), &p.assignment);
        assert_eq!(clean.assignment, p.assignment);
        assert!(clean.dropped.is_empty());

        for g in [i64::MAX, MAX_GENERATION, -1, i64::MIN] {
            let p = assignment(
                "a",
                Tasks(None),
                &Assignment {
                    generation: g,
                    ..Default::default()
                },
            );
            assert_eq!(p.dropped.len(), 1, "{g}");
            assert!(p.dropped[0].contains(&g.to_string()));
        }
        assert!(sane_generation(MAX_GENERATION - 1) && sane_generation(0));
    }

    fn task(backlog: i64, lag: Option<i64>) -> TaskStatus {
        TaskStatus {
            role: TaskRole::Active,
            state: TaskState::Running,
            restore_backlog: backlog,
            lag,
        }
    }

    #[test]
    fn reports_of_other_pods_unknown_tasks_and_negative_numbers_are_ignored() {
        let report = |tasks: Vec<(&str, TaskStatus)>, global: i64, applied: i64| WorkerStatus {
            applied_generation: applied,
            global_backlog: global,
            tasks: tasks.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            ..Default::default()
        };
        let raw = BTreeMap::from([
            (
                "a-0".to_string(),
                report(
                    vec![
                        ("0_0", task(-5, Some(-1))),
                        ("0_1", task(3, Some(7))),
                        ("9_9", task(i64::MAX, Some(0))),
                    ],
                    -10,
                    i64::MAX,
                ),
            ),
            ("a-2147483646".to_string(), report(vec![], i64::MAX, 3)),
            ("z-0".to_string(), report(vec![], 5, 3)),
            ("a-1".to_string(), report(vec![], 0, 6)),
        ]);
        let r = reports("a", Tasks(Some(&[2])), &raw);
        let pods: Vec<&str> = r.keys().map(String::as_str).collect();
        assert_eq!(pods, ["a-0", "a-1"]);
        let w = &r["a-0"];
        assert_eq!(w.tasks.len(), 2);
        assert_eq!(w.tasks["0_0"].restore_backlog, 0);
        assert_eq!(w.tasks["0_0"].lag, None, "a negative lag is unknown");
        assert_eq!(w.tasks["0_1"].lag, Some(7));
        assert_eq!(w.global_backlog, 0);
        assert_eq!(w.applied_generation, 0);
        assert_eq!(applied_floor(&r), 6);
        assert_eq!(backlog(&r), 3);
    }

    #[test]
    fn backlogs_add_up_without_overflowing() {
        let w = |global: i64, backlogs: &[i64]| WorkerStatus {
            global_backlog: global,
            tasks: backlogs
                .iter()
                .enumerate()
                .map(|(i, b)| (format!("0_{i}"), task(*b, None)))
                .collect(),
            ..Default::default()
        };
        let many = BTreeMap::from([
            ("a-0".to_string(), w(i64::MAX, &[i64::MAX, 1])),
            ("a-1".to_string(), w(i64::MAX, &[i64::MAX])),
        ]);
        assert_eq!(backlog(&many), i64::MAX);
        let negative = BTreeMap::from([("a-0".to_string(), w(i64::MIN, &[i64::MIN, 4]))]);
        assert_eq!(backlog(&negative), 4);
        assert_eq!(backlog(&BTreeMap::new()), 0);
    }

    #[test]
    fn a_long_problem_message_is_cut() {
        let w = WorkerStatus {
            problem: Some(WorkerProblem {
                reason: WorkerProblemReason::KafkaUnavailable,
                message: "é".repeat(10 * MAX_PROBLEM_MESSAGE),
                since: None,
            }),
            ..Default::default()
        };
        let r = reports("a", Tasks(None), &BTreeMap::from([("a-0".to_string(), w)]));
        let m = &r["a-0"].problem.as_ref().expect("problem").message;
        assert_eq!(m.chars().count(), MAX_PROBLEM_MESSAGE + 1);
    }
}
