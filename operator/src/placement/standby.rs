//! Standby replicas (`numStandbyReplicas`): copies of a stateful task's stores kept up to date
//! on other pods, where the task fails over to without a full restore. A task's standbys are
//! on distinct pods, never on its active's, never on pods that are leaving or down; they stay
//! where they were (their state is there), and a new one goes to the pod already holding the
//! most caught-up copy (the demoted former active, a finished warm-up), then to the pod with
//! the fewest standbys, then by ordinal.

use super::ordinal;
use eddy_crds::TaskId;
use std::collections::BTreeMap;

/// `k` standbys for each task of `tasks` (the stateful ones) over `pods` (those that may
/// hold any: up and staying), and on `keepers` only those they held already (a pod handing
/// its tasks over). `active` is each task's active pod, `previous` last generation's
/// standbys, `lag(pod, task)` the lag a pod reports for its copy of a task.
pub fn place(
    tasks: &[TaskId],
    active: &BTreeMap<TaskId, String>,
    (pods, keepers): (&[String], &[String]),
    k: usize,
    previous: &BTreeMap<TaskId, Vec<String>>,
    lag: impl Fn(&str, TaskId) -> Option<i64>,
) -> BTreeMap<TaskId, Vec<String>> {
    let mut count: BTreeMap<&str, usize> = pods.iter().map(|p| (p.as_str(), 0)).collect();
    let mut out = BTreeMap::new();
    if k == 0 {
        return out;
    }
    for t in tasks {
        let owner = active.get(t).map(String::as_str);
        let eligible = |p: &str| count.contains_key(p) && Some(p) != owner;
        let kept = |p: &str| eligible(p) || (keepers.iter().any(|k| k == p) && Some(p) != owner);
        let mut chosen: Vec<String> = previous
            .get(t)
            .into_iter()
            .flatten()
            .filter(|p| kept(p))
            .take(k)
            .cloned()
            .collect();
        while chosen.len() < k {
            let next = pods
                .iter()
                .filter(|p| eligible(p) && !chosen.contains(p))
                .min_by_key(|p| {
                    (
                        lag(p, *t).unwrap_or(i64::MAX),
                        count[p.as_str()],
                        ordinal(p),
                        p.to_string(),
                    )
                })
                .cloned();
            match next {
                Some(p) => chosen.push(p),
                None => break,
            }
        }
        for p in &chosen {
            if let Some(n) = count.get_mut(p.as_str()) {
                *n += 1;
            }
        }
        chosen.sort_by_key(|p| (ordinal(p), p.clone()));
        out.insert(*t, chosen);
    }
    out
}
