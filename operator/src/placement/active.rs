//! Where each task's active should be: balanced (every pod ⌊n/p⌋ or ⌈n/p⌉ tasks) and sticky
//! (a task stays with its owner while the owner is within its share), so a reconcile, an
//! operator restart or a scale-out moves as few tasks (and as little state) as possible.
//! This is the target; whether a task goes there now is decided by the caller (a stateful
//! task waits until its new home has caught up).

use super::ordinal;
use eddy_crds::TaskId;
use std::collections::BTreeMap;

/// The balanced target of every task over `pods` (in ordinal order). `owner` is where each
/// task runs now; `rank(pod, task)` orders the pods a task without a place can go to (lower
/// first: the pods holding the most caught-up copy of its state), then the least loaded,
/// then by ordinal. Empty when there is no pod.
pub fn ideal(
    tasks: &[TaskId],
    owner: &BTreeMap<TaskId, String>,
    pods: &[String],
    rank: impl Fn(&str, TaskId) -> i64,
) -> BTreeMap<TaskId, String> {
    let mut out = BTreeMap::new();
    if pods.is_empty() {
        return out;
    }
    let (base, extra) = (tasks.len() / pods.len(), tasks.len() % pods.len());
    let mut load: BTreeMap<&str, usize> = pods.iter().map(|p| (p.as_str(), 0)).collect();
    // At most `extra` pods may hold ⌈n/p⌉.
    let mut at_ceiling = 0;
    let room = |n: usize, at_ceiling: usize| n < base || (n == base && at_ceiling < extra);
    let mut unplaced = Vec::new();
    for t in tasks {
        match owner.get(t).and_then(|o| load.get_mut(o.as_str())) {
            Some(n) if room(*n, at_ceiling) => {
                *n += 1;
                if *n == base + 1 {
                    at_ceiling += 1;
                }
                out.insert(*t, owner[t].clone());
            }
            _ => unplaced.push(*t),
        }
    }
    for t in unplaced {
        let target = load
            .iter()
            .filter(|(_, n)| room(**n, at_ceiling))
            .min_by_key(|(pod, n)| (rank(pod, t), **n, ordinal(pod), pod.to_string()))
            .map(|(pod, _)| pod.to_string());
        if let Some(pod) = target {
            if let Some(n) = load.get_mut(pod.as_str()) {
                *n += 1;
                if *n == base + 1 {
                    at_ceiling += 1;
                }
            }
            out.insert(t, pod);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("a-{i}")).collect()
    }

    fn tasks(n: i32) -> Vec<TaskId> {
        (0..n).map(|p| TaskId::new(0, p)).collect()
    }

    #[test]
    fn balanced_sticky_and_ranked() {
        let t = tasks(6);
        let first = ideal(&t, &BTreeMap::new(), &pods(2), |_, _| 0);
        let loads = |m: &BTreeMap<TaskId, String>, p: &str| m.values().filter(|o| *o == p).count();
        assert_eq!((loads(&first, "a-0"), loads(&first, "a-1")), (3, 3));
        assert_eq!(ideal(&t, &first, &pods(2), |_, _| 0), first, "sticky");
        // A third pod takes two tasks; the others stay.
        let third = ideal(&t, &first, &pods(3), |_, _| 0);
        assert_eq!(loads(&third, "a-2"), 2);
        let kept = t.iter().filter(|id| third[id] == first[id]).count();
        assert_eq!(kept, 4);
        // An unowned task goes to the pod ranked first among those with room.
        let ranked = ideal(&tasks(4), &BTreeMap::new(), &pods(3), |pod, id| {
            if pod == "a-2" && id.partition == 0 {
                0
            } else {
                1
            }
        });
        assert_eq!(ranked[&TaskId::new(0, 0)], "a-2");
    }
}
