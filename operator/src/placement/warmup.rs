//! Warm-up replicas (`warmup.maxWarmupReplicas`, KIP-441): a stateful task that should move
//! to a pod lacking its state first gets a copy there, kept up to date like a standby; it
//! moves once that copy's reported lag is within `warmup.acceptableRecoveryLag`. At most
//! `max` warm-ups exist at once across the app, so a scale-out does not flood the brokers
//! with restores; the ones already running are kept first, and when a move completes the
//! next warm-up starts. A standby already on the target is its warm-up (no extra replica).

use eddy_crds::TaskId;
use std::collections::{BTreeMap, BTreeSet};

/// The warm-ups to place for the `pending` moves (task, target pod), in task order:
/// none where the target holds a standby of the task, the previous generation's first, at
/// most `max` in all.
pub fn select(
    pending: &[(TaskId, String)],
    standbys: &BTreeMap<TaskId, Vec<String>>,
    previous: &BTreeSet<(TaskId, String)>,
    max: usize,
) -> Vec<(TaskId, String)> {
    let needs: Vec<&(TaskId, String)> = pending
        .iter()
        .filter(|(t, target)| !standbys.get(t).is_some_and(|s| s.contains(target)))
        .collect();
    let (kept, new): (Vec<_>, Vec<_>) = needs.into_iter().partition(|m| previous.contains(m));
    kept.into_iter().chain(new).take(max).cloned().collect()
}
