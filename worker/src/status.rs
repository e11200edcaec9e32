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
use std::time::{Duration, Instant};

/// Records restored, per task id and store, for logs and tests.
pub type Restored = HashMap<(String, String), u64>;

/// Shared with the HTTP server, the operator link and the embedding application.
#[derive(Default)]
pub struct Status {
    /// True once every active task is RUNNING.
    pub ready: AtomicBool,
    /// Set to ask the loop to commit, close cleanly and return.
    pub shutdown: AtomicBool,
    /// Set on SIGTERM under the operator, before `shutdown`: the worker hands its active
    /// tasks over and takes no new one ([`Status::begin_stopping`]).
    pub stopping: AtomicBool,
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
    /// Under the operator: which of this worker's reports the API server acknowledged.
    pub lease: std::sync::Arc<Lease>,
    /// Reports asked for by [`Status::confirm_soon`]: the reporter sends one even if nothing
    /// changed.
    pub confirmations: AtomicU64,
}

/// What a worker under the operator knows of its link to the API server: when it sent the
/// last report the API server acknowledged (the answer carries the app as it is after the
/// report, so the assignment in it is at least as new as the report).
///
/// Two rules rest on it. A worker that dropped its tasks (a recovery, a fenced producer, a
/// lapsed lease) takes tasks again only from an assignment acknowledged after the drop
/// ([`Lease::confirmed_since`]), never from what it had cached: the operator may have moved
/// them meanwhile. And under at-least-once, where Kafka cannot fence a writer, a worker
/// writes only while its last acknowledged report is less than
/// [`WORKER_LEASE_SECONDS`](eddy_crds::resource::WORKER_LEASE_SECONDS) old
/// ([`Lease::check`]); the operator fails a pod over only well after that.
///
/// A lapse sticks until the processing thread has dropped its tasks ([`Lease::reset`]): a
/// report acknowledged after the lease ran out (the worker was frozen, or its processing
/// thread blocked, while it was cut off) does not make writing safe again, since the operator
/// may have failed the pod over in between; nor does one whose answer lists this pod as
/// failed over ([`Lease::revoke`]).
pub struct Lease {
    base: Instant,
    /// When the last acknowledged report was sent, in ns after `base` plus one (0: none).
    confirmed: AtomicU64,
    /// The lease ran out, or was revoked, since the tasks were last dropped.
    lapsed: AtomicBool,
    /// How long a lease lasts.
    term: Duration,
}

impl Default for Lease {
    fn default() -> Self {
        Lease::with_term(Duration::from_secs(
            eddy_crds::resource::WORKER_LEASE_SECONDS,
        ))
    }
}

/// The lease lapsed: this worker may not write.
#[derive(Clone, Debug, thiserror::Error)]
#[error(
    "no report of this worker reached the API server for {} s (the operator may be moving its tasks): stopped writing until one does",
    .0.as_secs()
)]
pub struct LeaseLapsed(pub Duration);

impl Lease {
    pub fn with_term(term: Duration) -> Lease {
        Lease {
            base: Instant::now(),
            confirmed: AtomicU64::new(0),
            lapsed: AtomicBool::new(false),
            term,
        }
    }

    fn ns(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX - 1) + 1
    }

    fn term_ns(&self) -> u64 {
        u64::try_from(self.term.as_nanos()).unwrap_or(u64::MAX)
    }

    /// A report sent at `sent` was acknowledged (call it after taking in the answer, so that
    /// [`Self::confirmed_since`] implies the assignment it brought is there). If the lease
    /// had run out before this answer came, the lapse sticks.
    pub fn confirm(&self, sent: Instant) {
        let before = self.confirmed.load(Ordering::SeqCst);
        if before > 0 && self.ns(Instant::now()) >= before.saturating_add(self.term_ns()) {
            self.lapsed.store(true, Ordering::SeqCst);
        }
        self.confirmed.fetch_max(self.ns(sent), Ordering::SeqCst);
    }

    /// The operator failed this pod over: writing is refused until the tasks were dropped.
    pub fn revoke(&self) {
        self.lapsed.store(true, Ordering::SeqCst);
    }

    /// The processing thread holds no task any more (it dropped them, or never had any): a
    /// past lapse no longer matters.
    pub fn reset(&self) {
        self.lapsed.store(false, Ordering::SeqCst);
    }

    /// A report sent after `t` was acknowledged.
    pub fn confirmed_since(&self, t: Instant) -> bool {
        self.confirmed.load(Ordering::SeqCst) > self.ns(t)
    }

    /// Ok while the last acknowledged report was sent less than the lease's term ago and the
    /// lease has not lapsed since the tasks were last dropped.
    pub fn check(&self) -> Result<(), LeaseLapsed> {
        let confirmed = self.confirmed.load(Ordering::SeqCst);
        let age = Duration::from_nanos(self.ns(Instant::now()).saturating_sub(confirmed));
        if confirmed > 0 && age < self.term && !self.lapsed.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(LeaseLapsed(age))
        }
    }
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

    /// Ask the reporter to send a report now even if nothing changed: its acknowledgement
    /// renews the lease and brings the assignment as of now.
    pub fn confirm_soon(&self) {
        self.confirmations.fetch_add(1, Ordering::Relaxed);
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

    /// Asked to stop under the operator: take no new task, and say so in the next report
    /// (`stopping`, written by the processing thread together with the tasks it holds, so a
    /// peer never reads `stopping` beside a task list that misses one just taken).
    pub fn begin_stopping(&self) {
        self.stopping.store(true, Ordering::Relaxed);
        self.report_soon();
    }

    /// Whether any other worker of the app reports: someone the tasks could be handed to.
    pub fn has_peers(&self) -> bool {
        self.peers.lock().is_ok_and(|p| !p.is_empty())
    }

    /// How many active tasks this worker runs or restores (its last report's).
    pub fn active_tasks(&self) -> usize {
        self.report.lock().map_or(0, |r| {
            r.tasks
                .values()
                .filter(|t| t.role == eddy_crds::resource::TaskRole::Active)
                .count()
        })
    }

    /// Called by the reporter after each report it sent.
    pub fn reported(&self) {
        if let Ok(mut n) = self.reports_sent.lock() {
            *n += 1;
        }
        self.report_sent.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_holds_for_its_term_after_the_acknowledged_report_was_sent() {
        let lease = Lease::with_term(Duration::from_millis(200));
        let start = Instant::now();
        assert!(lease.check().is_err(), "no report acknowledged yet");
        assert!(!lease.confirmed_since(start));
        lease.confirm(start + Duration::from_millis(1));
        assert!(lease.check().is_ok());
        assert!(lease.confirmed_since(start));
        // An older report acknowledged late does not move the lease back.
        lease.confirm(start);
        assert!(lease.confirmed_since(start));
        let dropped = Instant::now() + Duration::from_millis(5);
        assert!(
            !lease.confirmed_since(dropped),
            "a drop after the last report"
        );
        while lease.check().is_ok() {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(start.elapsed() >= Duration::from_millis(200));
        let err = lease.check().expect_err("lapsed");
        assert!(err.0 >= Duration::from_millis(200), "{err}");
        // Acknowledged after it ran out: the lapse sticks until the tasks were dropped.
        lease.confirm(Instant::now());
        assert!(
            lease.check().is_err(),
            "a late answer does not undo a lapse"
        );
        lease.reset();
        assert!(lease.check().is_ok(), "renewed once the tasks were dropped");
        lease.revoke();
        assert!(lease.check().is_err(), "revoked by a failover");
        lease.reset();
        assert!(lease.check().is_ok());
    }
}
