//! The worker's side of the operator's assignment. Under the operator a worker does not
//! join a consumer-group rebalance: it watches its own `StatefulStreamApp`, runs the tasks
//! `status.assignment` gives its pod (active, standby, warm-up), and reports what it holds
//! (per-task role, state, restore backlog and changelog lag, the generation it applied) into
//! its own entry of `status.workers` with server-side apply, the pod name as field manager:
//! at once after applying a generation, every 250 ms while something restores or a warm-up
//! catches up, and at least every [`REPORT_HEARTBEAT_SECONDS`] as a heartbeat.
//!
//! The API server's answer to a report is the app as the report left it: it renews the
//! worker's lease ([`crate::status::Lease`]) and brings the assignment as of then, which a
//! worker that dropped its tasks waits for before it takes any (docs/architecture.md,
//! "Hand-offs and zombies").

use crate::plan::Desired;
use crate::query::locate::PeerAddressing;
use crate::status::{Peer, Status};
use eddy_crds::resource::{
    AppStatus, MAX_GENERATION, REPORT_HEARTBEAT_SECONDS, StatefulStreamApp, TaskRole, TaskState,
    WorkerStatus,
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
    /// Where the other workers answer the queries this one forwards.
    pub peers: PeerAddressing,
}

impl Link {
    pub fn new(namespace: String, app: String, pod: String) -> Link {
        Link {
            peers: PeerAddressing::Service {
                app: app.clone(),
                namespace: namespace.clone(),
            },
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
        match event {
            Ok(watcher::Event::Apply(app) | watcher::Event::InitApply(app)) => {
                if let Some(st) = app.status {
                    observe(&link, &status, st);
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("watching app {}/{}: {e}", link.namespace, link.app),
        }
    }
    Ok(())
}

/// Take in the app's status as the watch or the answer to a report shows it: the peers'
/// reports, where queries go, and this pod's tasks. The assignment only moves forward: the
/// answer to a report can be newer than what the watch delivers next, and the operator
/// never publishes two assignments under one generation.
fn observe(link: &Link, status: &Status, st: AppStatus) {
    if let Ok(mut peers) = status.peers.lock() {
        *peers = st
            .workers
            .iter()
            .filter(|(pod, _)| **pod != link.pod)
            .map(|(pod, w)| {
                // Reports of workers from before roles existed say nothing: ACTIVE.
                let peer = Peer {
                    applied_generation: w.applied_generation,
                    stopping: w.stopping,
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
        peers: link.peers.clone(),
    });
    let Some(a) = st.assignment else {
        return;
    };
    if !(0..MAX_GENERATION).contains(&a.generation) {
        // Only the operator writes the assignment (the chart's admission policy keeps workers
        // out of it): one beyond what it writes would, followed, freeze this worker's view.
        tracing::warn!(
            generation = a.generation,
            "ignoring an assignment whose generation the operator never writes"
        );
        return;
    }
    let Ok(mut d) = status.desired.lock() else {
        return;
    };
    if d.as_ref().is_some_and(|d| d.generation >= a.generation) {
        return;
    }
    if a.down.contains(&link.pod) {
        // Failed over: whatever this worker still holds has a new owner, who does not wait.
        status.lease.revoke();
    }
    let desired = Desired::from_assignment(&a, &link.pod, &link.incarnation);
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
    // Confirmations asked for ([`Status::confirm_soon`]) that a report answered.
    let mut confirmed = 0;
    loop {
        let urgent = tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(250)) => false,
            _ = status.report_now.notified() => true,
        };
        let Some(mut report) = status.full_report() else {
            continue;
        };
        let asked = status
            .confirmations
            .load(std::sync::atomic::Ordering::Relaxed);
        let changed = last.as_ref() != Some(&report) || asked > confirmed;
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
        let sending = std::time::Instant::now();
        // Bounded: a link that drops packets would otherwise hold the reporter for minutes
        // after it healed.
        let answer = tokio::time::timeout(
            REPORT_TIMEOUT,
            api.patch_status(&link.app, &params, &Patch::Apply(&patch)),
        )
        .await;
        match answer {
            Ok(Ok(app)) => {
                // The API server took the report: the app it answers with is at least as new
                // as the report (taken in first, so that a confirmed lease implies it), and
                // the lease runs from when it was sent.
                if let Some(st) = app.status {
                    observe(&link, &status, st);
                }
                status.lease.confirm(sending);
                confirmed = asked;
                last = Some(sent);
                last_sent = tokio::time::Instant::now();
                status.reported();
            }
            Ok(Err(e)) => tracing::warn!("reporting status of {}: {e}", link.pod),
            Err(_) => tracing::warn!(
                "reporting status of {}: no answer in {} s",
                link.pod,
                REPORT_TIMEOUT.as_secs()
            ),
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

/// How long a report may take: a few heartbeats, well within the lease.
const REPORT_TIMEOUT: Duration = Duration::from_secs(10);

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
    fn the_assignment_only_moves_forward() {
        use eddy_crds::resource::{Assignment, PodTasks};
        let link = Link {
            namespace: "ns".into(),
            app: "a".into(),
            pod: "a-0".into(),
            incarnation: "run-1".into(),
            peers: PeerAddressing::Reported,
        };
        let status = Status::default();
        let at = |generation: i64, task: &str| AppStatus {
            assignment: Some(Assignment {
                generation,
                partitions: vec![2],
                pods: [(
                    "a-0".to_string(),
                    PodTasks {
                        active: vec![task.to_string()],
                        incarnation: Some("run-1".into()),
                        ..Default::default()
                    },
                )]
                .into(),
                down: Vec::new(),
            }),
            ..Default::default()
        };
        let desired = || {
            let d = status
                .desired
                .lock()
                .expect("lock")
                .clone()
                .expect("desired");
            (d.generation, d.active)
        };
        observe(&link, &status, at(5, "0_1"));
        assert_eq!(desired(), (5, vec!["0_1".parse().expect("id")]));
        // A watch lagging behind the answer to a report delivers an older generation: kept.
        observe(&link, &status, at(4, "0_0"));
        assert_eq!(desired(), (5, vec!["0_1".parse().expect("id")]));
        observe(&link, &status, at(6, "0_0"));
        assert_eq!(desired(), (6, vec!["0_0".parse().expect("id")]));
        // One the operator never writes (forged) would hold every later one back: ignored.
        observe(&link, &status, at(i64::MAX, "0_1"));
        assert_eq!(desired(), (6, vec!["0_0".parse().expect("id")]));
        observe(&link, &status, at(7, "0_1"));
        assert_eq!(desired().0, 7);
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
