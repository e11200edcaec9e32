//! The task assignor. librdkafka has no custom assignor and a consumer-group rebalance knows
//! nothing of where state lives, so the operator decides which pod runs which task and
//! writes it to `status.assignment`; workers consume by manual assignment and follow it.
//!
//! Placement is balanced (every pod gets ⌊n/p⌋ or ⌈n/p⌉ active tasks) and sticky: a task
//! stays on the pod that had it as long as that pod exists and is not over its share, so a
//! reconcile, an operator restart or a scale-out moves as few tasks (and as little state) as
//! possible. The generation only increases when the placement changes.

use eddy_crds::TaskId;
use eddy_crds::resource::{Assignment, PodTasks};
use std::collections::BTreeMap;

/// All tasks of an app: one per partition of each sub-topology's source.
pub fn tasks(partitions: &[i32]) -> Vec<TaskId> {
    partitions
        .iter()
        .enumerate()
        .flat_map(|(s, &n)| (0..n).map(move |p| TaskId::new(s as u32, p)))
        .collect()
}

/// Place every task active on exactly one of `pods`, keeping previous placements where the
/// balance allows.
pub fn assign(partitions: &[i32], pods: &[String], previous: Option<&Assignment>) -> Assignment {
    let all = tasks(partitions);
    let mut placed: BTreeMap<String, Vec<TaskId>> =
        pods.iter().map(|p| (p.clone(), Vec::new())).collect();
    if pods.is_empty() {
        return next(previous, partitions, placed);
    }
    let (base, extra) = (all.len() / pods.len(), all.len() % pods.len());
    // Pods keep what they had, up to ⌈n/p⌉; at most `extra` pods may hold that many.
    let mut at_ceiling = 0;
    let mut unplaced = Vec::new();
    let owner: BTreeMap<TaskId, &str> = previous
        .map(|a| {
            a.pods
                .iter()
                .flat_map(|(pod, t)| {
                    t.active
                        .iter()
                        .filter_map(move |id| Some((id.parse().ok()?, pod.as_str())))
                })
                .collect()
        })
        .unwrap_or_default();
    for t in &all {
        let kept = owner
            .get(t)
            .and_then(|pod| placed.get_mut(*pod))
            .filter(|list| {
                list.len() < base || (list.len() == base && extra > 0 && at_ceiling < extra)
            });
        match kept {
            Some(list) => {
                list.push(*t);
                if list.len() == base + 1 {
                    at_ceiling += 1;
                }
            }
            None => unplaced.push(*t),
        }
    }
    for t in unplaced {
        // The least loaded pod, first by name for determinism; respects the same ceiling.
        let target = placed
            .iter_mut()
            .filter(|(_, l)| l.len() < base || (l.len() == base && at_ceiling < extra))
            .min_by_key(|(name, l)| (l.len(), pod_ordinal(name), (*name).clone()))
            .map(|(_, l)| l);
        if let Some(list) = target {
            list.push(t);
            if list.len() == base + 1 {
                at_ceiling += 1;
            }
        }
    }
    next(previous, partitions, placed)
}

fn next(
    previous: Option<&Assignment>,
    partitions: &[i32],
    placed: BTreeMap<String, Vec<TaskId>>,
) -> Assignment {
    let pods: BTreeMap<String, PodTasks> = placed
        .into_iter()
        .map(|(pod, mut list)| {
            list.sort();
            (
                pod,
                PodTasks {
                    active: list.iter().map(TaskId::to_string).collect(),
                    ..Default::default()
                },
            )
        })
        .collect();
    let generation = match previous {
        Some(p) if p.pods == pods && p.partitions == partitions => p.generation,
        Some(p) => p.generation + 1,
        None => 1,
    };
    Assignment {
        generation,
        partitions: partitions.to_vec(),
        pods,
        down: Vec::new(),
    }
}

/// `app-3` → 3, so `app-10` sorts after `app-9`.
fn pod_ordinal(name: &str) -> u64 {
    name.rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("app-{i}")).collect()
    }

    fn check_complete_and_balanced(a: &Assignment, partitions: &[i32]) {
        let mut seen: Vec<String> = a.pods.values().flat_map(|p| p.active.clone()).collect();
        seen.sort();
        let mut want: Vec<String> = tasks(partitions).iter().map(TaskId::to_string).collect();
        want.sort();
        assert_eq!(seen, want, "every task active exactly once");
        let loads: Vec<usize> = a.pods.values().map(|p| p.active.len()).collect();
        let (min, max) = (loads.iter().min().copied(), loads.iter().max().copied());
        assert!(
            max.zip(min).is_some_and(|(x, n)| x - n <= 1),
            "balanced: {loads:?}"
        );
    }

    #[test]
    fn every_task_exactly_once_and_balanced_for_many_shapes() {
        for parts in [vec![1], vec![12], vec![7, 7], vec![3, 12, 5], vec![32, 32]] {
            for n in 1..=7 {
                let a = assign(&parts, &pods(n), None);
                check_complete_and_balanced(&a, &parts);
                assert_eq!(a.generation, 1);
            }
        }
    }

    #[test]
    fn sticky_across_reconciles() {
        let a = assign(&[12, 12], &pods(3), None);
        let b = assign(&[12, 12], &pods(3), Some(&a));
        assert_eq!(a, b, "nothing changed, nothing moves, same generation");
    }

    #[test]
    fn scale_out_moves_only_what_balance_needs() {
        let a = assign(&[12], &pods(3), None);
        let b = assign(&[12], &pods(4), Some(&a));
        check_complete_and_balanced(&b, &[12]);
        assert_eq!(b.generation, a.generation + 1);
        let moved = a
            .pods
            .iter()
            .map(|(pod, t)| {
                t.active
                    .iter()
                    .filter(|id| !b.pods[pod].active.contains(id))
                    .count()
            })
            .sum::<usize>();
        assert_eq!(
            moved, 3,
            "the new pod takes 3 tasks; the rest stay where their state is"
        );
    }

    #[test]
    fn scale_in_keeps_survivors_tasks() {
        let a = assign(&[12], &pods(4), None);
        let b = assign(&[12], &pods(3), Some(&a));
        check_complete_and_balanced(&b, &[12]);
        for pod in pods(3) {
            for id in &a.pods[&pod].active {
                assert!(
                    b.pods[&pod].active.contains(id),
                    "{id} moved off surviving {pod}"
                );
            }
        }
    }

    #[test]
    fn no_pods_means_no_placement() {
        let a = assign(&[4], &[], None);
        assert!(a.pods.is_empty());
    }
}
