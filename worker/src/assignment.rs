//! The worker's side of the operator's assignment. Under the operator a worker does not
//! join a consumer-group rebalance: it watches its own `StatefulStreamApp`, runs the tasks
//! `status.assignment` gives its pod, and reports what it runs (per-task state, restore
//! backlog, the generation it applied) into its own entry of `status.workers` with
//! server-side apply, the pod name as field manager, at a bounded rate.

use crate::runtime::{Peer, Status};
use eddy_crds::TaskId;
use eddy_crds::resource::StatefulStreamApp;
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
}

/// Watch the app and feed this pod's active tasks to the processing loop.
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
                    let peer = Peer {
                        applied_generation: w.applied_generation,
                        tasks: w.tasks.keys().filter_map(|t| t.parse().ok()).collect(),
                    };
                    (pod.clone(), peer)
                })
                .collect();
        }
        let Some(a) = st.assignment else {
            continue;
        };
        let mine: Vec<TaskId> = a
            .pods
            .get(&link.pod)
            .map(|p| p.active.iter().filter_map(|t| t.parse().ok()).collect())
            .unwrap_or_default();
        if let Ok(mut d) = status.desired.lock()
            && d.as_ref().map(|(g, _)| *g) != Some(a.generation)
        {
            tracing::info!(generation = a.generation, tasks = ?mine, "new assignment");
            *d = Some((a.generation, mine));
        }
    }
    Ok(())
}

/// Report this worker's tasks into `status.workers.<pod>` when they change: at most every
/// `every`, but every 250 ms while a task restores so the backlog is seen falling, and at
/// least every `REPORT_HEARTBEAT_SECONDS` as a heartbeat (the operator fails over the tasks
/// of a worker silent for `STALE_REPORT_SECONDS`).
pub async fn report(client: Client, link: Link, status: Arc<Status>, every: Duration) {
    let api: Api<StatefulStreamApp> = Api::namespaced(client, &link.namespace);
    let params = PatchParams::apply(&link.pod).force();
    let mut last = None;
    let mut last_sent = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let mut report = match status.report.lock() {
            Ok(r) => r.clone(),
            Err(_) => continue,
        };
        // Why the worker is not processing (while it retries), so the app's status says it.
        report.problem = status.problem.lock().ok().and_then(|p| p.clone());
        let restoring = report.tasks.values().any(|t| t.restore_backlog > 0);
        let changed = last.as_ref() != Some(&report);
        let due = if changed && (restoring || last_sent.elapsed() >= every) {
            true
        } else {
            last_sent.elapsed()
                >= Duration::from_secs(eddy_crds::resource::REPORT_HEARTBEAT_SECONDS)
        };
        if !due {
            continue;
        }
        let sent = report.clone();
        report.updated = Some(now_rfc3339());
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

fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}
