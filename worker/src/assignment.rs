//! The worker's side of the operator's assignment. Under the operator a worker does not
//! join a consumer-group rebalance: it watches its own `StatefulStreamApp`, runs the tasks
//! `status.assignment` gives its pod (active, standby, warm-up), and reports what it holds
//! (per-task role, state, restore backlog and changelog lag, the generation it applied) into
//! its own entry of `status.workers` with server-side apply, the pod name as field manager:
//! at once after applying a generation, every 250 ms while something restores or a warm-up
//! catches up, and at least every [`REPORT_HEARTBEAT_SECONDS`] as a heartbeat.

use crate::plan::Desired;
use crate::status::{Peer, Status};
use eddy_crds::resource::{
    REPORT_HEARTBEAT_SECONDS, StatefulStreamApp, TaskRole, TaskState, WorkerStatus,
};
use futures::StreamExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use std::sync::Arc;
use std::time::Duration;

/// Where this worker's app lives and who it is.
#[derive(Clone, Debug)]
pub struct Link {
    pub namespace: String,
    /// `metadata.name` of the app.
    pub app: String,
    /// The pod name.
    pub pod: String,
    /// This run of the worker (its start time): reported, and named by the assignment
    /// entries the operator makes for it.
    pub incarnation: String,
}

impl Link {
    pub fn new(namespace: String, app: String, pod: String) -> Link {
        Link {
            namespace,
            app,
            pod,
            incarnation: now_rfc3339(),
        }
    }
}

/// Watch the app and feed this pod's tasks to the processing loop.
pub async fn follow(client: Client, link: Link, status: Arc<Status>) -> anyhow::Result<()> {
    let api: Api<StatefulStreamApp> = Api::namespaced(client, &link.namespace);
    let cfg = watcher::Config::default().fields(&format!("metadata.name={}", link.app));
    let mut stream = std::pin::pin!(watcher::watcher(api, cfg).default_backoff());
    while let Some(event) = stream.next().await {
        let app = match event {
            Ok(watcher::Event::Apply(app) | watcher::Event::InitApply(app)) => app,
            Ok(_) => continue,
            Err(e) => {
                tracing::warn!("watching app {}/{}: {e}", link.namespace, link.app);
                continue;
            }
        };
        let Some(st) = app.status else { continue };
        if let Ok(mut peers) = status.peers.lock() {
            *peers = st
                .workers
                .iter()
                .filter(|(pod, _)| **pod != link.pod)
                .map(|(pod, w)| {
                    // Reports of workers from before roles existed say nothing: ACTIVE.
                    let peer = Peer {
                        applied_generation: w.applied_generation,
                        active: w
                            .tasks
                            .iter()
                            .filter(|(_, t)| t.role == TaskRole::Active)
                            .filter_map(|(id, _)| id.parse().ok())
                            .collect(),
                    };
                    (pod.clone(), peer)
                })
                .collect();
        }
        // Queries are routed by the same view: who holds which task, where each worker answers.
        status.queries.set_cluster(crate::query::Cluster {
            assignment: st.assignment.clone().unwrap_or_default(),
            workers: st.workers.clone(),
        });
        let Some(a) = st.assignment else {
            continue;
        };
        let desired = Desired::from_assignment(&a, &link.pod, &link.incarnation);
        if let Ok(mut d) = status.desired.lock()
            && d.as_ref().map(|d| d.generation) != Some(a.generation)
        {
            tracing::info!(generation = a.generation, active = ?desired.active,
                standby = ?desired.standby, warmup = ?desired.warmup, down = ?desired.down,
                "new assignment");
            if a.pods.get(&link.pod).is_some_and(|p| {
                p.incarnation.as_deref() != Some(link.incarnation.as_str())
                    && !(p.active.is_empty() && p.standby.is_empty() && p.warmup.is_empty())
            }) {
                tracing::info!(
                    generation = a.generation,
                    "this pod's tasks in the assignment were decided before the operator saw this run of its worker: waiting for an assignment made for this run"
                );
            }
            *d = Some(desired);
        }
    }
    Ok(())
}

/// Report this worker's tasks into `status.workers.<pod>` when they change: at once when
/// the processing thread asks ([`Status::report_soon`]: a generation applied, tasks let go),
/// at most every `every` otherwise, but every 250 ms while a task restores or a warm-up
/// catches up (so the operator sees it caught up within a second), and at least every
/// [`REPORT_HEARTBEAT_SECONDS`] (the operator fails a silent worker over).
pub async fn report(client: Client, link: Link, status: Arc<Status>, every: Duration) {
    let api: Api<StatefulStreamApp> = Api::namespaced(client, &link.namespace);
    let params = PatchParams::apply(&link.pod).force();
    let heartbeat = Duration::from_secs(REPORT_HEARTBEAT_SECONDS);
    let mut last: Option<WorkerStatus> = None;
    let mut last_sent = tokio::time::Instant::now();
    loop {
        let urgent = tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(250)) => false,
            _ = status.report_now.notified() => true,
        };
        let Some(mut report) = status.full_report() else {
            continue;
        };
        let changed = last.as_ref() != Some(&report);
        // The report that shows a warm-up caught up goes out at once too: the operator moves
        // the task on it. One that shows a restore over waits its turn, so the backlog stays
        // in the status long enough to be seen.
        let hurry = catching_up(&report) || last.as_ref().is_some_and(warming_up);
        let due = if changed && (urgent || hurry || last_sent.elapsed() >= every) {
            true
        } else {
            // Ahead of the heartbeat bound, so a slow API server does not make it stale.
            last_sent.elapsed() >= heartbeat.saturating_sub(Duration::from_secs(1))
        };
        if !due {
            continue;
        }
        let sent = report.clone();
        report.updated = Some(now_rfc3339());
        report.incarnation = Some(link.incarnation.clone());
        let patch = serde_json::json!({
            "apiVersion": eddy_crds::API_VERSION,
            "kind": eddy_crds::KIND,
            "metadata": {"name": link.app},
            "status": {"workers": {link.pod.clone(): report}},
        });
        match api
            .patch_status(&link.app, &params, &Patch::Apply(&patch))
            .await
        {
            Ok(_) => {
                last = Some(sent);
                last_sent = tokio::time::Instant::now();
                status.reported();
            }
            Err(e) => tracing::warn!("reporting status of {}: {e}", link.pod),
        }
    }
}

/// Something the operator is waiting to see progress on: an active task restoring, a
/// replica catching up from far behind, a warm-up not yet at the changelogs' end.
fn catching_up(r: &WorkerStatus) -> bool {
    r.tasks.values().any(|t| {
        t.restore_backlog > 0
            || t.state == TaskState::Restoring
            || (t.role == TaskRole::Warmup && t.lag.is_none_or(|l| l > 0))
    })
}

/// A warm-up has not caught up yet (or not reported its lag).
fn warming_up(r: &WorkerStatus) -> bool {
    r.tasks
        .values()
        .any(|t| t.role == TaskRole::Warmup && t.lag.is_none_or(|l| l > 0))
}

fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use eddy_crds::resource::TaskStatus;

    fn with(t: TaskStatus) -> WorkerStatus {
        WorkerStatus {
            tasks: [("0_0".to_string(), t)].into(),
            ..Default::default()
        }
    }

    #[test]
    fn reports_fast_while_restoring_or_a_warmup_catches_up() {
        let running = TaskStatus {
            role: TaskRole::Active,
            state: TaskState::Running,
            restore_backlog: 0,
            lag: Some(0),
        };
        assert!(!catching_up(&with(running.clone())));
        assert!(catching_up(&with(TaskStatus {
            state: TaskState::Restoring,
            restore_backlog: 10,
            ..running.clone()
        })));
        let warmup = TaskStatus {
            role: TaskRole::Warmup,
            lag: Some(5),
            ..running.clone()
        };
        assert!(catching_up(&with(warmup.clone())));
        assert!(warming_up(&with(warmup.clone())));
        assert!(!catching_up(&with(TaskStatus {
            lag: Some(0),
            ..warmup.clone()
        })));
        // After a warm-up the next report is hurried (the operator moves the task on it),
        // after a restore it is not (the backlog stays visible).
        assert!(!warming_up(&with(TaskStatus {
            state: TaskState::Restoring,
            restore_backlog: 10,
            ..running.clone()
        })));
        assert!(!warming_up(&with(TaskStatus {
            lag: Some(0),
            ..warmup
        })));
        // A standby following a busy changelog always lags a little: not a reason to
        // report four times a second.
        assert!(!catching_up(&with(TaskStatus {
            role: TaskRole::Standby,
            lag: Some(5),
            ..running
        })));
    }
}
