//! The operator's metrics on `/metrics`: its own work (reconciles, their duration, leadership)
//! and, while it leads, one set of gauges per app read from the status it just wrote
//! (`eddy_operator_app_*`: phase, conditions, replicas, restore backlog, assignment
//! generation, standby and warm-up lag), so alert rules see what `kubectl get ssapp` shows.
//! [`AppSeries::of`] is the pure part (status in, samples out); [`Metrics`] keeps which
//! label sets each app has, so an app that goes leaves no series behind.

use eddy_crds::resource::{AppStatus, Phase, TaskRole};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `ok`, `error`, or `conflict`.
    pub result: String,
}

/// An app: its namespace and name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct AppLabels {
    pub namespace: String,
    pub app: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub namespace: String,
    pub app: String,
    pub phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConditionLabels {
    pub namespace: String,
    pub app: String,
    /// `Ready`, `Progressing` or `Degraded`.
    pub condition: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub namespace: String,
    pub app: String,
    pub condition: String,
    /// The condition's reason, e.g. `InvalidSpec`.
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StandbyLabels {
    pub namespace: String,
    pub app: String,
    pub task: String,
    /// The worker pod holding the copy.
    pub pod: String,
    /// `standby` or `warmup`, as in the worker's `eddy_standby_tasks{role}`.
    pub role: String,
}

/// The phases of the status, each with a series (1 for the current one).
const PHASES: [Phase; 4] = [
    Phase::Pending,
    Phase::Restoring,
    Phase::Running,
    Phase::Degraded,
];
const CONDITION_STATUSES: [&str; 3] = ["True", "False", "Unknown"];

/// What one app's gauges show: a pure function of its status.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AppSeries {
    /// Every phase with 1 for the current one (all 0 before the first decision).
    pub phase: Vec<(String, i64)>,
    /// (condition, status, value): each condition with 1 for its status.
    pub conditions: Vec<(String, String, i64)>,
    /// (condition, reason) of each condition: alerts choose their severity by it.
    pub reasons: Vec<(String, String)>,
    pub desired_replicas: i64,
    pub ready_replicas: i64,
    pub restore_backlog_records: i64,
    /// None before the first assignment.
    pub assignment_generation: Option<i64>,
    /// `warmup.acceptableRecoveryLag`; None when the spec cannot be read.
    pub acceptable_recovery_lag: Option<i64>,
    /// (task, pod, role, lag) of each standby and warm-up copy whose lag its worker reported.
    pub standby_lag: Vec<(String, String, String, i64)>,
}

impl AppSeries {
    pub fn of(status: &AppStatus, acceptable_recovery_lag: Option<i64>) -> Self {
        let phase = PHASES
            .iter()
            .map(|p| (format!("{p:?}"), i64::from(status.phase == Some(*p))))
            .collect();
        let conditions = status
            .conditions
            .iter()
            .flat_map(|c| {
                CONDITION_STATUSES
                    .iter()
                    .map(|s| (c.type_.clone(), s.to_string(), i64::from(c.status == *s)))
            })
            .collect();
        let reasons = status
            .conditions
            .iter()
            .map(|c| (c.type_.clone(), label_word(&c.reason)))
            .collect();
        // Workers write these: a malformed task id or a negative lag is left out (it is no
        // lag of a task), so a worker cannot invent label values or negative series.
        let well_formed = crate::placement::sanitize::Tasks(None);
        let standby_lag = status
            .workers
            .iter()
            .flat_map(|(pod, w)| {
                w.tasks.iter().filter_map(move |(task, t)| {
                    let role = match t.role {
                        TaskRole::Active => return None,
                        TaskRole::Standby => "standby",
                        TaskRole::Warmup => "warmup",
                    };
                    well_formed.get(task)?;
                    let lag = t.lag.filter(|l| *l >= 0)?;
                    Some((task.clone(), pod.clone(), role.to_string(), lag))
                })
            })
            .collect();
        AppSeries {
            phase,
            conditions,
            reasons,
            desired_replicas: i64::from(status.replicas),
            ready_replicas: i64::from(status.ready_replicas),
            restore_backlog_records: status.backlog,
            assignment_generation: status.assignment.as_ref().map(|a| a.generation),
            acceptable_recovery_lag,
            standby_lag,
        }
    }
}

/// A condition's reason as a label value: the operator writes CamelCase words; anything else
/// (a status edited by hand) becomes `Other`, so no one can add series of any name or size.
fn label_word(reason: &str) -> String {
    let word = !reason.is_empty()
        && reason.len() <= 64
        && reason.chars().all(|c| c.is_ascii_alphanumeric());
    match word {
        true => reason.to_string(),
        false => "Other".to_string(),
    }
}

/// The label sets an app has series for, to remove them when it goes.
#[derive(Default)]
struct Shown {
    conditions: BTreeSet<(String, String)>,
    reasons: BTreeSet<(String, String)>,
    standby: BTreeSet<(String, String, String)>,
}

pub struct Metrics {
    registry: Registry,
    pub reconciles: Family<ResultLabels, Counter>,
    pub duration: Histogram,
    /// 1 while this replica holds the leader lease.
    pub leader: Gauge,
    app_phase: Family<PhaseLabels, Gauge>,
    app_condition: Family<ConditionLabels, Gauge>,
    app_condition_reason: Family<ReasonLabels, Gauge>,
    app_desired_replicas: Family<AppLabels, Gauge>,
    app_ready_replicas: Family<AppLabels, Gauge>,
    app_restore_backlog: Family<AppLabels, Gauge>,
    app_assignment_generation: Family<AppLabels, Gauge>,
    app_acceptable_recovery_lag: Family<AppLabels, Gauge>,
    app_standby_lag: Family<StandbyLabels, Gauge>,
    apps: Mutex<BTreeMap<AppLabels, Shown>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let m = Self {
            registry: Registry::default(),
            reconciles: Family::default(),
            duration: Histogram::new(exponential_buckets(0.005, 2.0, 12)),
            leader: Gauge::default(),
            app_phase: Family::default(),
            app_condition: Family::default(),
            app_condition_reason: Family::default(),
            app_desired_replicas: Family::default(),
            app_ready_replicas: Family::default(),
            app_restore_backlog: Family::default(),
            app_assignment_generation: Family::default(),
            app_acceptable_recovery_lag: Family::default(),
            app_standby_lag: Family::default(),
            apps: Mutex::default(),
        };
        // Both results exist from the start: `increase()` sees the first error.
        for result in ["ok", "error"] {
            let _ = m.reconciles.get_or_create(&ResultLabels {
                result: result.to_string(),
            });
        }
        let r = registry.sub_registry_with_prefix("eddy_operator");
        eddy_telemetry::register_build_info(r, env!("CARGO_PKG_VERSION"));
        r.register(
            "reconciles",
            "Reconciles of StatefulStreamApps, by result",
            m.reconciles.clone(),
        );
        r.register(
            "reconcile_duration_seconds",
            "Time to reconcile one app",
            m.duration.clone(),
        );
        r.register(
            "leader",
            "1 while this replica is the leader",
            m.leader.clone(),
        );
        r.register(
            "app_phase",
            "1 for the phase an app is in (Pending, Restoring, Running, Degraded), 0 for the others",
            m.app_phase.clone(),
        );
        r.register(
            "app_condition",
            "1 for the status (True, False, Unknown) of each condition of an app (Ready, Progressing, Degraded, MemoryLimitLow)",
            m.app_condition.clone(),
        );
        r.register(
            "app_condition_reason",
            "1 for the reason each condition of an app has now (e.g. Degraded: InvalidSpec)",
            m.app_condition_reason.clone(),
        );
        r.register(
            "app_desired_replicas",
            "Worker pods the app's StatefulSet should run (spec.replicas, more while draining)",
            m.app_desired_replicas.clone(),
        );
        r.register(
            "app_ready_replicas",
            "Worker pods of the app that are Ready",
            m.app_ready_replicas.clone(),
        );
        r.register(
            "app_restore_backlog_records",
            "Changelog records the app's active tasks have left to restore (status.backlog)",
            m.app_restore_backlog.clone(),
        );
        r.register(
            "app_assignment_generation",
            "Generation of the app's task assignment (status.assignment.generation)",
            m.app_assignment_generation.clone(),
        );
        r.register(
            "app_acceptable_recovery_lag_records",
            "warmup.acceptableRecoveryLag of the app: a warm-up lagging by at most this many records takes over its task",
            m.app_acceptable_recovery_lag.clone(),
        );
        r.register(
            "app_standby_lag_records",
            "Changelog records a standby or warm-up copy of a task lacks, as its worker last reported (role standby or warmup)",
            m.app_standby_lag.clone(),
        );
        // Standard names, without the prefix.
        eddy_telemetry::register_process_metrics(&mut registry);
        Self { registry, ..m }
    }
}

impl Metrics {
    /// A reconcile that took `took`, with its result: `ok`, `error`, or `conflict` (a status
    /// write refused because what its assignment was decided from changed meanwhile;
    /// decided again after 100 ms).
    pub fn observe(&self, took: Duration, result: &str) {
        self.duration.observe(took.as_secs_f64());
        self.reconciles
            .get_or_create(&ResultLabels {
                result: result.to_string(),
            })
            .inc();
    }

    /// Show an app as `series` says: its earlier series that `series` lacks (a condition
    /// gone, a warm-up that took over) are removed.
    pub fn set_app(&self, namespace: &str, app: &str, series: &AppSeries) {
        let key = AppLabels {
            namespace: namespace.to_string(),
            app: app.to_string(),
        };
        let mut apps = self.apps.lock().unwrap_or_else(PoisonError::into_inner);
        let shown = apps.entry(key.clone()).or_default();
        let (ns, name) = (namespace.to_string(), app.to_string());
        for (phase, v) in &series.phase {
            self.app_phase
                .get_or_create(&PhaseLabels {
                    namespace: ns.clone(),
                    app: name.clone(),
                    phase: phase.clone(),
                })
                .set(*v);
        }
        let conditions: BTreeSet<(String, String)> = series
            .conditions
            .iter()
            .map(|(c, s, _)| (c.clone(), s.clone()))
            .collect();
        for (condition, status) in shown.conditions.difference(&conditions) {
            self.app_condition.remove(&ConditionLabels {
                namespace: ns.clone(),
                app: name.clone(),
                condition: condition.clone(),
                status: status.clone(),
            });
        }
        for (condition, status, v) in &series.conditions {
            self.app_condition
                .get_or_create(&ConditionLabels {
                    namespace: ns.clone(),
                    app: name.clone(),
                    condition: condition.clone(),
                    status: status.clone(),
                })
                .set(*v);
        }
        shown.conditions = conditions;
        let reasons: BTreeSet<(String, String)> = series.reasons.iter().cloned().collect();
        for (condition, reason) in shown.reasons.difference(&reasons) {
            self.app_condition_reason.remove(&ReasonLabels {
                namespace: ns.clone(),
                app: name.clone(),
                condition: condition.clone(),
                reason: reason.clone(),
            });
        }
        for (condition, reason) in &reasons {
            self.app_condition_reason
                .get_or_create(&ReasonLabels {
                    namespace: ns.clone(),
                    app: name.clone(),
                    condition: condition.clone(),
                    reason: reason.clone(),
                })
                .set(1);
        }
        shown.reasons = reasons;
        self.app_desired_replicas
            .get_or_create(&key)
            .set(series.desired_replicas);
        self.app_ready_replicas
            .get_or_create(&key)
            .set(series.ready_replicas);
        self.app_restore_backlog
            .get_or_create(&key)
            .set(series.restore_backlog_records);
        match series.assignment_generation {
            Some(g) => {
                self.app_assignment_generation.get_or_create(&key).set(g);
            }
            None => {
                self.app_assignment_generation.remove(&key);
            }
        }
        match series.acceptable_recovery_lag {
            Some(l) => {
                self.app_acceptable_recovery_lag.get_or_create(&key).set(l);
            }
            None => {
                self.app_acceptable_recovery_lag.remove(&key);
            }
        }
        let standby: BTreeSet<(String, String, String)> = series
            .standby_lag
            .iter()
            .map(|(t, p, r, _)| (t.clone(), p.clone(), r.clone()))
            .collect();
        for (task, pod, role) in shown.standby.difference(&standby) {
            self.app_standby_lag.remove(&StandbyLabels {
                namespace: ns.clone(),
                app: name.clone(),
                task: task.clone(),
                pod: pod.clone(),
                role: role.clone(),
            });
        }
        for (task, pod, role, lag) in &series.standby_lag {
            self.app_standby_lag
                .get_or_create(&StandbyLabels {
                    namespace: ns.clone(),
                    app: name.clone(),
                    task: task.clone(),
                    pod: pod.clone(),
                    role: role.clone(),
                })
                .set(*lag);
        }
        shown.standby = standby;
    }

    /// Remove every series of an app (deleted).
    pub fn remove_app(&self, namespace: &str, app: &str) {
        let key = AppLabels {
            namespace: namespace.to_string(),
            app: app.to_string(),
        };
        let mut apps = self.apps.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(shown) = apps.remove(&key) {
            self.forget(&key, &shown);
        }
    }

    /// Remove the series of every app `keep` says no to (gone from the watch cache without
    /// a cleanup this replica saw, e.g. its finalizer removed by hand).
    pub fn retain_apps(&self, keep: impl Fn(&str, &str) -> bool) {
        let mut apps = self.apps.lock().unwrap_or_else(PoisonError::into_inner);
        let gone: Vec<AppLabels> = apps
            .keys()
            .filter(|k| !keep(&k.namespace, &k.app))
            .cloned()
            .collect();
        for key in gone {
            if let Some(shown) = apps.remove(&key) {
                self.forget(&key, &shown);
            }
        }
    }

    /// Remove every app's series: this replica no longer leads, the new leader shows them.
    pub fn clear_apps(&self) {
        self.retain_apps(|_, _| false);
    }

    fn forget(&self, key: &AppLabels, shown: &Shown) {
        let (ns, name) = (key.namespace.clone(), key.app.clone());
        for p in PHASES {
            self.app_phase.remove(&PhaseLabels {
                namespace: ns.clone(),
                app: name.clone(),
                phase: format!("{p:?}"),
            });
        }
        for (condition, status) in &shown.conditions {
            self.app_condition.remove(&ConditionLabels {
                namespace: ns.clone(),
                app: name.clone(),
                condition: condition.clone(),
                status: status.clone(),
            });
        }
        for (condition, reason) in &shown.reasons {
            self.app_condition_reason.remove(&ReasonLabels {
                namespace: ns.clone(),
                app: name.clone(),
                condition: condition.clone(),
                reason: reason.clone(),
            });
        }
        for (task, pod, role) in &shown.standby {
            self.app_standby_lag.remove(&StandbyLabels {
                namespace: ns.clone(),
                app: name.clone(),
                task: task.clone(),
                pod: pod.clone(),
                role: role.clone(),
            });
        }
        for family in [
            &self.app_desired_replicas,
            &self.app_ready_replicas,
            &self.app_restore_backlog,
            &self.app_assignment_generation,
            &self.app_acceptable_recovery_lag,
        ] {
            family.remove(key);
        }
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eddy_crds::resource::{Assignment, Condition, TaskState, TaskStatus, WorkerStatus};

    fn condition(type_: &str, status: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "R".into(),
            message: "m".into(),
            last_transition_time: None,
            observed_generation: None,
        }
    }

    fn task(role: TaskRole, lag: Option<i64>) -> TaskStatus {
        TaskStatus {
            role,
            state: TaskState::Running,
            restore_backlog: 0,
            lag,
        }
    }

    fn status(phase: Phase, degraded: &str) -> AppStatus {
        AppStatus {
            phase: Some(phase),
            conditions: vec![
                condition(
                    "Ready",
                    if phase == Phase::Running {
                        "True"
                    } else {
                        "False"
                    },
                ),
                condition("Degraded", degraded),
            ],
            replicas: 3,
            ready_replicas: 2,
            backlog: 1234,
            assignment: Some(Assignment {
                generation: 7,
                ..Default::default()
            }),
            workers: BTreeMap::from([
                (
                    "a-0".to_string(),
                    WorkerStatus {
                        tasks: BTreeMap::from([
                            ("0_0".to_string(), task(TaskRole::Active, Some(0))),
                            ("0_1".to_string(), task(TaskRole::Standby, Some(12))),
                        ]),
                        ..Default::default()
                    },
                ),
                (
                    "a-1".to_string(),
                    WorkerStatus {
                        tasks: BTreeMap::from([
                            ("0_0".to_string(), task(TaskRole::Warmup, Some(5000))),
                            ("0_2".to_string(), task(TaskRole::Standby, None)),
                        ]),
                        ..Default::default()
                    },
                ),
            ]),
            ..Default::default()
        }
    }

    /// The value of the one sample of `name` whose labels contain all of `labels`.
    fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
        let found: Vec<f64> = text
            .lines()
            .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
            .filter(|l| labels.iter().all(|f| l.contains(f)))
            .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
            .collect();
        assert!(found.len() <= 1, "{name} {labels:?} matches {found:?}");
        found.first().copied()
    }

    #[test]
    fn the_series_follow_the_status() {
        let s = AppSeries::of(&status(Phase::Restoring, "False"), Some(10_000));
        assert_eq!(
            s.phase,
            vec![
                ("Pending".to_string(), 0),
                ("Restoring".to_string(), 1),
                ("Running".to_string(), 0),
                ("Degraded".to_string(), 0)
            ]
        );
        assert!(
            s.conditions
                .contains(&("Degraded".into(), "False".into(), 1))
        );
        assert!(
            s.conditions
                .contains(&("Degraded".into(), "True".into(), 0))
        );
        assert!(
            s.conditions
                .contains(&("Ready".into(), "Unknown".into(), 0))
        );
        assert_eq!(s.conditions.len(), 6);
        assert_eq!(
            s.reasons,
            vec![
                ("Ready".into(), "R".into()),
                ("Degraded".into(), "R".into())
            ]
        );
        let mut odd = status(Phase::Degraded, "True");
        odd.conditions[1].reason = "made up by hand\n".into();
        assert_eq!(
            AppSeries::of(&odd, None).reasons[1],
            ("Degraded".into(), "Other".into())
        );
        assert_eq!(
            (
                s.desired_replicas,
                s.ready_replicas,
                s.restore_backlog_records
            ),
            (3, 2, 1234)
        );
        assert_eq!(s.assignment_generation, Some(7));
        // Actives and copies whose lag is not known yet are left out.
        assert_eq!(
            s.standby_lag,
            vec![
                ("0_1".into(), "a-0".into(), "standby".into(), 12),
                ("0_0".into(), "a-1".into(), "warmup".into(), 5000),
            ]
        );
        let empty = AppSeries::of(&AppStatus::default(), None);
        assert!(empty.phase.iter().all(|(_, v)| *v == 0));
        assert_eq!(empty.assignment_generation, None);
    }

    #[test]
    fn an_app_is_shown_while_it_exists_and_changes_with_its_status() {
        let m = Metrics::default();
        let (ns, app) = ("ns1", "a");
        let at = |extra: &str| {
            [
                format!("namespace=\"{ns}\""),
                format!("app=\"{app}\""),
                extra.to_string(),
            ]
        };
        let find = |text: &str, name: &str, extra: &str| {
            let l = at(extra);
            sample(text, name, &[&l[0], &l[1], &l[2]])
        };

        m.set_app(
            ns,
            app,
            &AppSeries::of(&status(Phase::Restoring, "False"), Some(10_000)),
        );
        let t = m.encode();
        assert_eq!(
            find(&t, "eddy_operator_app_phase", "phase=\"Restoring\""),
            Some(1.0)
        );
        assert_eq!(
            find(&t, "eddy_operator_app_phase", "phase=\"Running\""),
            Some(0.0)
        );
        assert_eq!(
            find(
                &t,
                "eddy_operator_app_condition",
                "condition=\"Degraded\",status=\"False\""
            ),
            Some(1.0)
        );
        assert_eq!(
            find(&t, "eddy_operator_app_desired_replicas", ""),
            Some(3.0)
        );
        assert_eq!(find(&t, "eddy_operator_app_ready_replicas", ""), Some(2.0));
        assert_eq!(
            find(&t, "eddy_operator_app_restore_backlog_records", ""),
            Some(1234.0)
        );
        assert_eq!(
            find(&t, "eddy_operator_app_assignment_generation", ""),
            Some(7.0)
        );
        assert_eq!(
            find(&t, "eddy_operator_app_acceptable_recovery_lag_records", ""),
            Some(10_000.0)
        );
        assert_eq!(
            find(
                &t,
                "eddy_operator_app_standby_lag_records",
                "task=\"0_0\",pod=\"a-1\",role=\"warmup\""
            ),
            Some(5000.0)
        );

        // Degraded: the phase moves, the condition flips, the warm-up that took over goes.
        let mut degraded = status(Phase::Degraded, "True");
        degraded.conditions.retain(|c| c.type_ == "Degraded");
        degraded.conditions[0].reason = "InvalidSpec".into();
        if let Some(w) = degraded.workers.get_mut("a-1") {
            w.tasks.remove("0_0");
        }
        m.set_app(ns, app, &AppSeries::of(&degraded, Some(10_000)));
        let t = m.encode();
        assert_eq!(
            find(&t, "eddy_operator_app_phase", "phase=\"Degraded\""),
            Some(1.0)
        );
        assert_eq!(
            find(&t, "eddy_operator_app_phase", "phase=\"Restoring\""),
            Some(0.0)
        );
        assert_eq!(
            find(
                &t,
                "eddy_operator_app_condition",
                "condition=\"Degraded\",status=\"True\""
            ),
            Some(1.0)
        );
        assert_eq!(
            find(
                &t,
                "eddy_operator_app_condition",
                "condition=\"Degraded\",status=\"False\""
            ),
            Some(0.0)
        );
        assert_eq!(
            find(&t, "eddy_operator_app_condition", "condition=\"Ready\""),
            None,
            "a condition no longer in the status has no series"
        );
        assert_eq!(
            find(
                &t,
                "eddy_operator_app_condition_reason",
                "condition=\"Degraded\",reason=\"InvalidSpec\""
            ),
            Some(1.0)
        );
        assert_eq!(
            find(
                &t,
                "eddy_operator_app_condition_reason",
                "condition=\"Degraded\",reason=\"R\""
            ),
            None,
            "a reason no longer in the status has no series"
        );
        assert_eq!(
            find(
                &t,
                "eddy_operator_app_standby_lag_records",
                "role=\"warmup\""
            ),
            None
        );
        assert_eq!(
            find(
                &t,
                "eddy_operator_app_standby_lag_records",
                "role=\"standby\""
            ),
            Some(12.0)
        );

        // Another app is left alone when this one is deleted.
        m.set_app(
            "ns2",
            "b",
            &AppSeries::of(&status(Phase::Running, "False"), None),
        );
        m.remove_app(ns, app);
        let t = m.encode();
        assert!(
            !t.contains(&format!("namespace=\"{ns}\"")),
            "a deleted app leaves no series:\n{t}"
        );
        assert_eq!(
            sample(
                &t,
                "eddy_operator_app_phase",
                &["app=\"b\"", "phase=\"Running\""]
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &t,
                "eddy_operator_app_acceptable_recovery_lag_records",
                &["app=\"b\""]
            ),
            None
        );

        // An app gone from the cache, and all of them when leadership is lost.
        m.set_app(
            ns,
            app,
            &AppSeries::of(&status(Phase::Running, "False"), None),
        );
        m.retain_apps(|ns, _| ns == "ns2");
        assert!(!m.encode().contains(&format!("namespace=\"{ns}\"")));
        m.clear_apps();
        let t = m.encode();
        assert!(!t.contains("eddy_operator_app_phase{"), "{t}");
        assert!(t.contains("eddy_operator_build_info{version="), "{t}");
    }
}
