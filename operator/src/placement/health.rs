//! Is a pod up? What the operator sees of a worker pod (its Pod object and its worker's
//! report), reduced to up, stopping, or down with the cause. Readiness is deliberately not
//! part of it: a worker restoring its tasks is not Ready, and failing it over would restart
//! the restore somewhere else.

use eddy_crds::resource::{STALE_REPORT_SECONDS, TaskRole, WorkerStatus};
use k8s_openapi::jiff::Timestamp;
use std::collections::BTreeMap;
use std::fmt;

/// A worker pod as its Pod object shows it (a pod without a Pod object is simply absent).
#[derive(Clone, Debug, PartialEq)]
pub enum PodObserved {
    /// It has a deletionTimestamp: it is stopping (deleted, evicted, rolled).
    Terminating,
    /// Its worker container has not started yet (unscheduled, pulling, creating) since
    /// `since` (the pod's creation).
    Starting { since: Timestamp },
    /// Its worker container is not running after it ran or failed to: waiting with this
    /// reason (e.g. `CrashLoopBackOff`), or terminated.
    Failing { reason: String },
    /// Its worker container runs, since `started`.
    Running { started: Timestamp },
}

/// Why a pod counts as down.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DownCause {
    /// No Pod object.
    Gone,
    Terminating,
    /// The worker container is not running (the reason Kubernetes gives).
    NotRunning(String),
    /// The worker container did not start within the bound (seconds since the pod was created).
    NotStarted(u64),
    /// The worker's last report is this many seconds old.
    Silent(u64),
    /// The worker has not reported since its container started, this many seconds ago.
    NeverReported(u64),
}

impl fmt::Display for DownCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DownCause::Gone => f.write_str("its pod is gone"),
            DownCause::Terminating => f.write_str("its pod is terminating"),
            DownCause::NotRunning(r) => write!(f, "its worker container is not running: {r}"),
            DownCause::NotStarted(s) => {
                write!(f, "its worker container has not started in {s}s")
            }
            DownCause::Silent(s) => write!(f, "its worker has not reported for {s}s"),
            DownCause::NeverReported(s) => {
                write!(f, "its worker has not reported since it started {s}s ago")
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    /// Running, and its current container has reported.
    Up,
    /// Starting, or running without a report from its current container yet: it may get
    /// tasks, but a pod failed over stays in `assignment.down` until it reports.
    Starting,
    /// Terminating under at-least-once, its last report still fresh: its worker may be
    /// committing its last batch and nothing can fence it, so its tasks stay until its
    /// container stops (a new owner restoring meanwhile would miss its last changelog writes).
    Stopping,
    /// Terminating, its worker handing its active tasks over (its fresh report says it does,
    /// `handoffSeconds`, or that it is `stopping`; or running, told to stop by its kubelet):
    /// it takes no active task, and its actives move to caught-up copies on other pods
    /// as a drained pod's do, while it keeps processing them until then.
    HandingOff,
    Down(DownCause),
}

impl Health {
    pub fn is_up(&self) -> bool {
        matches!(self, Health::Up | Health::Starting)
    }
}

/// The health of `pod` in `health` (None: the pods are not observed, every pod counts as
/// up); a pod missing from the map has no Pod object.
pub fn of(health: Option<&BTreeMap<String, Health>>, pod: &str) -> Health {
    match health {
        None => Health::Up,
        Some(h) => h.get(pod).cloned().unwrap_or(Health::Down(DownCause::Gone)),
    }
}

/// The health of each pod named in `names`, from the observed pods (absent: no Pod object),
/// the workers' reports, how long ago the operator first saw each pod's current report
/// (`seen`, seconds on its own monotonic clock; a report missing there was just seen) and
/// the time.
///
/// Silence is measured on the operator's clock, as client-go's leader election measures a
/// lease (`observedTime`), never by the worker's `updated` against the operator's `now`:
/// a worker's clock running behind, or a watch cache lagging, would fail a pod over early,
/// before its worker's lease provably lapsed (see [`eddy_crds::resource::WORKER_LEASE_SECONDS`]).
/// A report counts only when the pod's current container made it (not older than its start:
/// a restarted pod's previous report says nothing of it); the container's start and the
/// report's `updated` are both the node's clock. `fenced`: the app runs exactly-once, so a
/// terminating pod's tasks can move at once (their new owners fence it); otherwise a
/// terminating pod is [`Health::Stopping`] until gone, or silent, and so is a pod gone with a
/// fresh report of active tasks until that report is as old as a silent pod's.
pub fn assess<'a>(
    names: impl IntoIterator<Item = &'a String>,
    pods: &BTreeMap<String, PodObserved>,
    reports: &BTreeMap<String, WorkerStatus>,
    seen: &BTreeMap<String, u64>,
    now: Timestamp,
    fenced: bool,
) -> BTreeMap<String, Health> {
    let secs = |since: Timestamp| {
        u64::try_from(now.as_second().saturating_sub(since.as_second())).unwrap_or(0)
    };
    let last_report = |name: &String| {
        reports
            .get(name)
            .and_then(|w| w.updated.as_deref())
            .and_then(|u| u.parse::<Timestamp>().ok())
    };
    let age = |name: &String| seen.get(name).copied().unwrap_or(0);
    names
        .into_iter()
        .map(|name| {
            let health = match pods.get(name) {
                // No Pod object, but a fresh report of active tasks: under at-least-once its
                // process may still run (a pod force-deleted, its node deleted) and nothing
                // fences it, so its tasks wait for its lease to have surely lapsed. A worker
                // that stops cleanly reports its tasks released first.
                None if !fenced
                    && age(name) <= STALE_REPORT_SECONDS
                    && reports
                        .get(name)
                        .is_some_and(|w| w.tasks.values().any(|t| t.role == TaskRole::Active)) =>
                {
                    Health::Stopping
                }
                None => Health::Down(DownCause::Gone),
                // Its worker hands its tasks over when told to stop (it said so in every
                // report): from the moment the pod is deleted, before the SIGTERM reaches it.
                Some(PodObserved::Terminating)
                    if age(name) <= STALE_REPORT_SECONDS
                        && reports
                            .get(name)
                            .is_some_and(|w| w.handoff_seconds > 0 || w.stopping) =>
                {
                    Health::HandingOff
                }
                Some(PodObserved::Terminating) if fenced => Health::Down(DownCause::Terminating),
                Some(PodObserved::Terminating) => match last_report(name) {
                    Some(_) if age(name) <= STALE_REPORT_SECONDS => Health::Stopping,
                    Some(_) => Health::Down(DownCause::Silent(age(name))),
                    None => Health::Down(DownCause::Terminating),
                },
                Some(PodObserved::Failing { reason }) => {
                    Health::Down(DownCause::NotRunning(reason.clone()))
                }
                Some(PodObserved::Starting { since }) if secs(*since) > STALE_REPORT_SECONDS => {
                    Health::Down(DownCause::NotStarted(secs(*since)))
                }
                Some(PodObserved::Starting { .. }) => Health::Starting,
                Some(PodObserved::Running { started }) => {
                    let report = last_report(name).filter(|u| u >= started);
                    match report {
                        Some(_) if age(name) > STALE_REPORT_SECONDS => {
                            Health::Down(DownCause::Silent(age(name)))
                        }
                        // Told to stop without its pod going (a liveness probe failed):
                        // it hands its tasks over as well, and takes no new one.
                        Some(_) if reports.get(name).is_some_and(|w| w.stopping) => {
                            Health::HandingOff
                        }
                        Some(_) => Health::Up,
                        None if secs(*started) > STALE_REPORT_SECONDS => {
                            Health::Down(DownCause::NeverReported(secs(*started)))
                        }
                        None => Health::Starting,
                    }
                }
            };
            (name.clone(), health)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().expect("time")
    }

    fn report(updated: &str) -> WorkerStatus {
        WorkerStatus {
            updated: Some(updated.into()),
            ..Default::default()
        }
    }

    /// Under exactly-once.
    fn one(pod: Option<PodObserved>, report: Option<WorkerStatus>) -> Health {
        judge(pod, report, true)
    }

    /// The report's age on the operator's clock, as if it had been seen as soon as it was made
    /// by a worker whose clock agrees with the operator's.
    fn judge(pod: Option<PodObserved>, report: Option<WorkerStatus>, fenced: bool) -> Health {
        let now = at("2026-01-01T00:01:00Z");
        let age = report
            .as_ref()
            .and_then(|r| r.updated.as_deref())
            .map(|u| u64::try_from(now.as_second() - at(u).as_second()).unwrap_or(0));
        judge_seen(pod, report, age, fenced)
    }

    fn judge_seen(
        pod: Option<PodObserved>,
        report: Option<WorkerStatus>,
        seen: Option<u64>,
        fenced: bool,
    ) -> Health {
        let name = "a-0".to_string();
        let pods = pod.into_iter().map(|p| (name.clone(), p)).collect();
        let reports = report.into_iter().map(|r| (name.clone(), r)).collect();
        let seen = seen.into_iter().map(|s| (name.clone(), s)).collect();
        let now = at("2026-01-01T00:01:00Z");
        assess([&name], &pods, &reports, &seen, now, fenced)[&name].clone()
    }

    /// A worker whose clock is off, or a report that reached the operator late, is judged by
    /// when the operator first saw the report, not by the time written in it.
    #[test]
    fn silence_is_measured_on_the_operators_clock() {
        let running = || {
            Some(PodObserved::Running {
                started: at("2026-01-01T00:00:00Z"),
            })
        };
        // The worker's clock is 10 minutes behind (its report says 23:50 while the operator
        // reads 00:01), but the operator saw this report 2 s ago: up.
        let behind = || {
            Some(WorkerStatus {
                updated: Some("2026-01-01T00:00:05Z".into()),
                ..Default::default()
            })
        };
        assert_eq!(judge_seen(running(), behind(), Some(2), true), Health::Up);
        assert_eq!(
            judge_seen(running(), behind(), None, true),
            Health::Up,
            "a report not seen before counts as just seen"
        );
        assert_eq!(
            judge_seen(running(), behind(), Some(STALE_REPORT_SECONDS), true),
            Health::Up
        );
        assert_eq!(
            judge_seen(running(), behind(), Some(STALE_REPORT_SECONDS + 1), true),
            Health::Down(DownCause::Silent(STALE_REPORT_SECONDS + 1))
        );
        // A clock ahead does not keep a silent worker up either.
        let ahead = || {
            Some(WorkerStatus {
                updated: Some("2026-01-01T01:00:00Z".into()),
                ..Default::default()
            })
        };
        assert_eq!(
            judge_seen(running(), ahead(), Some(40), true),
            Health::Down(DownCause::Silent(40))
        );
        let t = || Some(PodObserved::Terminating);
        assert_eq!(judge_seen(t(), behind(), Some(3), false), Health::Stopping);
        assert_eq!(
            judge_seen(t(), behind(), Some(31), false),
            Health::Down(DownCause::Silent(31))
        );
    }

    #[test]
    fn a_terminating_pod_under_at_least_once_is_stopping_until_gone_or_silent() {
        let t = || Some(PodObserved::Terminating);
        assert_eq!(
            judge(t(), Some(report("2026-01-01T00:00:58Z")), false),
            Health::Stopping
        );
        assert!(
            !Health::Stopping.is_up(),
            "a stopping pod gets no new tasks"
        );
        assert_eq!(
            judge(t(), Some(report("2026-01-01T00:00:20Z")), false),
            Health::Down(DownCause::Silent(40)),
            "a terminating pod that stopped reporting long ago is cut off: fail it over"
        );
        assert_eq!(
            judge(t(), None, false),
            Health::Down(DownCause::Terminating),
            "a worker that never reported took no task"
        );
        assert_eq!(
            judge(None, Some(report("2026-01-01T00:00:58Z")), false),
            Health::Down(DownCause::Gone),
            "gone after reporting nothing held"
        );
        let holding = |updated: &str| {
            let mut r = report(updated);
            r.tasks.insert(
                "0_0".into(),
                eddy_crds::resource::TaskStatus {
                    role: TaskRole::Active,
                    ..Default::default()
                },
            );
            r
        };
        assert_eq!(
            judge(None, Some(holding("2026-01-01T00:00:58Z")), false),
            Health::Stopping,
            "gone with a fresh report of active tasks: its process may still run"
        );
        assert_eq!(
            judge(None, Some(holding("2026-01-01T00:00:20Z")), false),
            Health::Down(DownCause::Gone),
            "its lease has surely lapsed"
        );
        assert_eq!(
            judge(None, Some(holding("2026-01-01T00:00:58Z")), true),
            Health::Down(DownCause::Gone),
            "exactly-once fences it"
        );
        assert_eq!(
            judge(t(), Some(report("2026-01-01T00:00:58Z")), true),
            Health::Down(DownCause::Terminating),
            "exactly-once fences it instead of waiting"
        );
    }

    /// A worker that says it hands its tasks over (`stopping`) keeps them while its report is
    /// fresh, under either guarantee; silent, it is cut off as any other.
    #[test]
    fn a_terminating_pod_whose_worker_hands_over_is_handing_off_while_it_reports() {
        let t = || Some(PodObserved::Terminating);
        let stopping = |updated: &str| {
            let mut r = report(updated);
            r.stopping = true;
            r
        };
        // Deleted a moment ago: the SIGTERM has not reached it, but it says it will hand over.
        let willing = |updated: &str| {
            let mut r = report(updated);
            r.handoff_seconds = 20;
            r
        };
        for fenced in [false, true] {
            assert_eq!(
                judge(t(), Some(stopping("2026-01-01T00:00:58Z")), fenced),
                Health::HandingOff
            );
            assert_eq!(
                judge(t(), Some(willing("2026-01-01T00:00:58Z")), fenced),
                Health::HandingOff
            );
            assert_eq!(
                judge(t(), Some(stopping("2026-01-01T00:00:20Z")), false),
                Health::Down(DownCause::Silent(40))
            );
        }
        assert!(!Health::HandingOff.is_up(), "it takes no task");
        let running = || {
            Some(PodObserved::Running {
                started: at("2026-01-01T00:00:00Z"),
            })
        };
        assert_eq!(
            judge(running(), Some(stopping("2026-01-01T00:00:58Z")), true),
            Health::HandingOff,
            "told to stop by its kubelet (a liveness probe), not by a deletion"
        );
        assert_eq!(
            judge(running(), Some(willing("2026-01-01T00:00:58Z")), true),
            Health::Up
        );
        assert_eq!(
            judge(None, Some(stopping("2026-01-01T00:00:58Z")), true),
            Health::Down(DownCause::Gone),
            "gone is gone"
        );
    }

    #[test]
    fn each_down_cause() {
        let running = || {
            Some(PodObserved::Running {
                started: at("2026-01-01T00:00:00Z"),
            })
        };
        assert_eq!(one(None, None), Health::Down(DownCause::Gone));
        assert_eq!(
            one(Some(PodObserved::Terminating), None),
            Health::Down(DownCause::Terminating)
        );
        assert_eq!(
            one(
                Some(PodObserved::Failing {
                    reason: "CrashLoopBackOff".into()
                }),
                None
            ),
            Health::Down(DownCause::NotRunning("CrashLoopBackOff".into()))
        );
        assert_eq!(
            one(running(), Some(report("2026-01-01T00:00:20Z"))),
            Health::Down(DownCause::Silent(40))
        );
        assert_eq!(
            one(running(), None),
            Health::Down(DownCause::NeverReported(60))
        );
        // A report of the previous container does not count for this one.
        assert_eq!(
            one(running(), Some(report("2025-12-31T23:59:59Z"))),
            Health::Down(DownCause::NeverReported(60))
        );
        assert_eq!(
            one(
                Some(PodObserved::Starting {
                    since: at("2026-01-01T00:00:00Z")
                }),
                None
            ),
            Health::Down(DownCause::NotStarted(60))
        );
    }

    #[test]
    fn up_while_starting_restoring_or_reporting() {
        assert_eq!(
            one(
                Some(PodObserved::Starting {
                    since: at("2026-01-01T00:00:45Z")
                }),
                None
            ),
            Health::Starting
        );
        let started = at("2026-01-01T00:00:40Z");
        assert_eq!(
            one(Some(PodObserved::Running { started }), None),
            Health::Starting,
            "a worker that just started has time to report"
        );
        let started = at("2026-01-01T00:00:00Z");
        assert_eq!(
            one(
                Some(PodObserved::Running { started }),
                Some(report("2026-01-01T00:00:55.5Z"))
            ),
            Health::Up
        );
    }
}
