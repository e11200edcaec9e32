//! What the processing thread shares with the HTTP server, the operator link and the
//! embedding application: readiness, shutdown, the operator's assignment, peers' reports and
//! this worker's own report. It sits below the runtime and restore so neither imports the
//! other for it.

pub use crate::plan::{Desired, Peer};
use eddy_crds::resource::{TaskStatus, WorkerProblem, WorkerStatus};
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Records restored, per task id and store, for logs and tests.
pub type Restored = HashMap<(String, String), u64>;

/// Shared with the HTTP server, the operator link and the embedding application.
#[derive(Default)]
pub struct Status {
    /// True once every active task is RUNNING.
    pub ready: AtomicBool,
    /// Set to ask the loop to commit, close cleanly and return.
    pub shutdown: AtomicBool,
    /// What the last restore did, for tests and logs.
    pub restored: Mutex<Restored>,
    /// Run the tasks in `desired` instead of every task (set when the operator assigns).
    pub follow_assignment: bool,
    /// The operator's assignment for this worker (the latest generation seen).
    pub desired: Mutex<Option<Desired>>,
    /// Under the operator: what each other worker of the app reports, by pod.
    pub peers: Mutex<HashMap<String, Peer>>,
    /// What this worker runs, for its entry in the app's `status.workers`: the active
    /// tasks (written by the processing thread).
    pub report: Mutex<WorkerStatus>,
    /// The standby and warm-up tasks, by id (written by the state updater); the reporter
    /// sends them with `report`.
    pub replicas: Mutex<BTreeMap<String, TaskStatus>>,
    /// Wakes the reporter to send at once (an assignment applied, tasks released).
    pub report_now: tokio::sync::Notify,
    /// Reports sent to the app's status so far (under the operator), and a signal for each.
    pub reports_sent: Mutex<u64>,
    pub report_sent: std::sync::Condvar,
    /// When the processing thread last made progress, in ms since the UNIX epoch (0: not
    /// started); `/healthz` fails when it is older than `livenessTimeoutMs`.
    pub heartbeat: AtomicU64,
    /// Why the worker is not processing, while it retries (None when all is well).
    pub problem: Mutex<Option<WorkerProblem>>,
    /// The stores and copies the query API reads (published by the processing thread and
    /// the state updater).
    pub queries: std::sync::Arc<crate::query::Catalog>,
}

impl Status {
    /// The processing thread is making progress (or waiting on purpose): called once per
    /// turn of its loops.
    pub fn beat(&self) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self.heartbeat.store(now, Ordering::Relaxed);
    }

    /// Under the operator, wait (at most `timeout`) until the status reporter has sent the
    /// current report; standalone, return at once.
    pub fn await_report(&self, timeout: Duration) {
        if !self.follow_assignment {
            return;
        }
        let Ok(sent) = self.reports_sent.lock() else {
            return;
        };
        let seen = *sent;
        let _ = self
            .report_sent
            .wait_timeout_while(sent, timeout, |n| *n == seen);
    }

    /// Ask the reporter to send the current report now rather than at its next turn.
    pub fn report_soon(&self) {
        self.report_now.notify_one();
    }

    /// The report to send: the active tasks and the replicas together.
    pub fn full_report(&self) -> Option<WorkerStatus> {
        let mut r = self.report.lock().ok()?.clone();
        if let Ok(replicas) = self.replicas.lock() {
            for (id, t) in replicas.iter() {
                r.tasks.entry(id.clone()).or_insert_with(|| t.clone());
            }
        }
        r.problem = self.problem.lock().ok().and_then(|p| p.clone());
        Some(r)
    }

    /// Called by the reporter after each report it sent.
    pub fn reported(&self) {
        if let Ok(mut n) = self.reports_sent.lock() {
            *n += 1;
        }
        self.report_sent.notify_all();
    }
}
